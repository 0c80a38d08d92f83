"""Test-only faults, planted by a case's ``inject`` field, to show the harness catches each.

A harness that never saw a broken kernel cannot be trusted to report one: ``wrong`` perturbs
one element of roller's output before the comparison, ``segfault`` kills the worker with
SIGSEGV, ``hang`` sleeps past any timeout and ``error`` raises, all where the real step would
have run. Cases the generator makes never carry a fault.
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np

from harness.random_cases.case import Case

HANG_S = 24 * 3600.0


class InjectedError(RuntimeError):
    """The fault ``error`` plants: an exception from inside a check's step."""


def before_step(case: Case) -> None:
    """The process-level faults, raised from inside the step that builds roller's kernel."""
    if case.inject == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(HANG_S)  # the signal is delivered asynchronously; never go on
    elif case.inject == "hang":
        time.sleep(HANG_S)
    elif case.inject == "error":
        raise InjectedError("fault injected by the case (inject='error')")


def perturb(case: Case, out: np.ndarray) -> np.ndarray:
    """``out`` with its first element moved well outside any tolerance for ``wrong``."""
    if case.inject != "wrong" or out.size == 0:
        return out
    bad = np.array(out, copy=True)
    flat = bad.reshape(-1)
    flat[0] = flat[0] + 1.0 + 2.0 * float(np.max(np.abs(out)))
    return bad
