"""Other processes' load while the suite times: measured, and optionally waited out.

On a shared 2-core machine a test run in another process takes one core; PyTorch's 2-thread
(OpenMP) kernels then slow by up to 100x and roller's by up to ~1.6x, so ratios to PyTorch
measured meanwhile say nothing about either kernel. ``foreign_share`` measures the share of all
CPUs other processes used over an interval (Linux ``/proc/stat`` minus this process's CPU
time); ``wait_for_quiet`` waits until that share stays low before a workload is timed.
"""
from __future__ import annotations

import os
import time
from typing import Optional, Tuple

BUSY_SHARE = 0.1  # other processes' share of the CPUs above which a timing is "busy"
PROBE_S = 1.0  # one look at the machine while waiting

CpuSample = Tuple[float, float, float]  # (machine busy s, this process's CPU s, wall s)


def cpu_sample() -> Optional[CpuSample]:
    """The machine's non-idle CPU seconds (/proc/stat), this process's (and its finished
    children's) CPU seconds, and the wall clock; None where /proc/stat is missing."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if len(fields) < 8 or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    busy = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    return busy, sum(os.times()[:4]), time.perf_counter()


def foreign_share(start: Optional[CpuSample]) -> Optional[float]:
    """The share of all CPUs that other processes used since ``start`` (None if unknown)."""
    end = cpu_sample()
    if start is None or end is None or end[2] <= start[2]:
        return None
    other = (end[0] - start[0]) - (end[1] - start[1])
    return round(max(0.0, other) / ((end[2] - start[2]) * (os.cpu_count() or 1)), 3)


def wait_for_quiet(budget_s: float, probe_s: float = PROBE_S) -> Tuple[float, bool]:
    """Sleep in ``probe_s`` looks until other processes use at most BUSY_SHARE of the CPUs
    over one look, or ``budget_s`` has passed. Returns (seconds waited, quiet at the end)."""
    t0 = time.perf_counter()
    while True:
        start = cpu_sample()
        if start is None:
            return 0.0, True  # cannot tell: do not wait
        time.sleep(probe_s)
        share = foreign_share(start)
        waited = time.perf_counter() - t0
        if share is not None and share <= BUSY_SHARE:
            return waited, True
        if waited >= budget_s:
            return waited, False
