"""Other processes' load (tvm_roller.tools.suite.quiet) and the suite's wait-and-retry for a
quiet machine (runner.run_suite(wait_quiet_s=...))."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tvm_roller.tools.suite import quiet, runner

pytestmark = pytest.mark.skipif(quiet.cpu_sample() is None, reason="needs /proc/stat")


def test_foreign_share_subtracts_this_process(monkeypatch):
    """(machine busy s, own CPU s, wall s): 3 s of the machine's 4 CPU-seconds busy, 1 of them
    this process's, over 2 s of 2 CPUs -> others used half."""
    monkeypatch.setattr(quiet.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(quiet, "cpu_sample", lambda: (13.0, 6.0, 102.0))
    assert quiet.foreign_share((10.0, 5.0, 100.0)) == 0.5
    assert quiet.foreign_share((12.9, 5.0, 100.0)) == 0.0  # own time above the total: none
    assert quiet.foreign_share(None) is None


def test_another_process_is_foreign():
    """A child spinning on one of the CPUs (not yet reaped, so not this process's time) is
    counted: at least ~1 CPU's share whatever else runs."""
    spin = "import time\nprint('go', flush=True)\nt=time.time()\nwhile time.time()-t<2.0: pass"
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "go\n"  # spinning from here on
        start = quiet.cpu_sample()
        time.sleep(1.0)
        share = quiet.foreign_share(start)
    finally:
        child.wait()
        child.stdout.close()
    ncpu = os.cpu_count() or 1
    assert 0.8 / ncpu <= share <= 1.05, share  # 1.0 give or take the clock ticks' rounding


def test_wait_for_quiet_keeps_to_its_budget():
    t0 = time.perf_counter()
    waited, _ = quiet.wait_for_quiet(0.0, probe_s=0.2)
    assert waited == pytest.approx(time.perf_counter() - t0, abs=0.05) and waited < 1.0


def _fake_run(shares):
    calls = []

    def run_workload(cls, idx, target, **kwargs):
        share = shares[len(calls)]
        calls.append(kwargs)
        return {"workload": f"{cls}:{idx}", "foreign_cpu": share, "notes": [], "try": len(calls)}

    return run_workload, calls


@pytest.mark.parametrize("shares, wait, expect_try, expect_calls", [
    ([0.5, 0.02, 0.9], 1.0, 2, 2),  # disturbed once, then quiet: the quiet record
    ([0.5, 0.3, 0.4], 1.0, 2, 3),  # disturbed every time: the least disturbed of 3
    ([0.5, 0.0, 0.0], 0.0, 1, 1),  # no waiting asked: one record, whatever its load
])
def test_disturbed_workload_is_timed_again(monkeypatch, shares, wait, expect_try, expect_calls):
    fake, calls = _fake_run(shares)
    monkeypatch.setattr(runner, "run_workload", fake)
    monkeypatch.setattr(quiet, "wait_for_quiet", lambda budget_s: (3.0, False))
    rec = runner.run_quiet_workload("GMM", 0, None, {"rounds": 3}, wait)
    assert rec["try"] == expect_try and len(calls) == expect_calls
    assert all(c == {"rounds": 3} for c in calls)
    if wait:
        assert rec["notes"][-1].startswith("waited for a quiet machine: 3 s (still busy)")
    else:
        assert rec["notes"] == []
