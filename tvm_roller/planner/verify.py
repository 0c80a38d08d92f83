"""The wrong-result guard: roller's kernel of a function run once on random inputs against TVM's
default build of the same function (opt-in: ``verify=True``), so a silently wrong kernel
becomes an error entry and a fallback instead of a wrong model.

The arguments are ``planner.inputs``' (random floats never zero, integers zero, outputs NaN). Only
functions with static shapes, for a target this machine runs, whose default build would run
within the budget (TVM's unscheduled loops run at about 0.5 GFLOP/s) are checked; the others
are reported as skipped, with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import tirx

from tvm_roller.planner.context import Context
from tvm_roller.planner.inputs import output_params, random_arguments
from tvm_roller.planner.roofline import bound_of, param_bytes

#: the unscheduled default build's rate, to estimate how long checking a function takes
_DEFAULT_GFLOPS = 0.5
#: largest relative difference (to the output's largest magnitude) of float outputs
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Verdict:
    """``ok`` False: the outputs differ (``detail`` says how); ``checked`` False: skipped."""

    ok: bool
    checked: bool
    detail: str


def verify(func: tirx.PrimFunc, kernel_build, ctx: Context, budget_s: float = 2.0,
           seed: int = 0) -> Verdict:
    """``kernel_build`` (roller's build of ``func``) against TVM's default build of ``func``."""
    why = _why_not(func, ctx, budget_s)
    if why:
        return Verdict(True, False, f"skipped: {why}")
    prim = func if func.attrs is not None and "global_symbol" in func.attrs else \
        func.with_attr("global_symbol", "main")
    reference = tvm.compile(ctx.backend.default_schedule(tvm.IRModule({"main": prim}),
                                                         ctx.target), target=ctx.target)
    outputs = output_params(func)
    arrays = random_arguments(func, seed)
    if any(a is None for a in arrays):
        return Verdict(True, False, "skipped: scalar parameters")
    got = _run(kernel_build, arrays)
    want = _run(reference, arrays)
    worst = 0.0
    for i in sorted(outputs):
        ok, diff = _close(got[i], want[i])
        if not ok:
            return Verdict(False, True, f"output {func.params[i].name} differs from TVM's "
                                        f"default build ({diff})")
        worst = max(worst, diff if isinstance(diff, float) else 0.0)
    return Verdict(True, True, f"matches TVM's default build (max rel. err {worst:.1e})")


def _why_not(func: tirx.PrimFunc, ctx: Context, budget_s: float) -> str:
    if ctx.backend.runner_device != "cpu":
        return f"a {ctx.target.kind.name} kernel does not run on this machine"
    if param_bytes(func) is None:
        return "symbolic shapes"
    b = bound_of(func, ctx)
    estimate = (b.flops if b else 0.0) / (_DEFAULT_GFLOPS * 1e9)
    if estimate > budget_s:
        return f"TVM's default build would take about {estimate:.0f} s (budget {budget_s:g} s)"
    return ""


def _run(executable, arrays) -> list:
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a.copy(), dev) for a in arrays]
    executable["main"](*args)
    return [a.numpy() for a in args]


def _close(got: np.ndarray, want: np.ndarray):
    if got.dtype.kind != "f":
        same = np.array_equal(got, want)
        return same, 0.0 if same else f"{int((got != want).sum())} elements differ"
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    if not np.array_equal(nan_got, nan_want):
        return False, f"{int((nan_got != nan_want).sum())} elements NaN in one build only"
    scale = float(np.abs(want[~nan_want]).max()) if (~nan_want).any() else 0.0
    diff = float(np.abs(got[~nan_got] - want[~nan_want]).max()) if (~nan_want).any() else 0.0
    rel = diff / scale if scale > 0 else diff
    if not math.isfinite(rel) or rel > TOLERANCE:
        return False, f"max rel. err {rel:.2e}"
    return True, rel
