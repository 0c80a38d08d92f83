"""TVM's CPU thread pool, sized for every core roller plans for.

TVM's pool assumes hyper-threading on x86 and uses half the logical CPUs (one thread on a
2-vCPU machine); it reads ``TVM_NUM_THREADS`` once, when it first starts, and keeps that size
for the life of the process. Roller's kernels are planned for every core, so the first call into
roller (``planner.Context.make``; a tool that runs TVM modules without one calls it itself) sets
the variable unless the user chose a count (``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS``).
Importing the package changes nothing.
"""
from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def size_thread_pool() -> None:
    """Default ``TVM_NUM_THREADS`` to the usable cores unless ``TVM_NUM_THREADS`` or
    ``OMP_NUM_THREADS`` is set. Idempotent. It takes effect only before TVM's pool first starts
    (the first parallel kernel run in this process); after that it changes the variable, not
    the pool."""
    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(usable_cores())
