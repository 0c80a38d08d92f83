"""One case on the CPU: roller's build against TVM's unscheduled float64 build.

``tvm_roller.build(func, host target, fallback=False)``, so a decline is a visible outcome
rather than a silent fallback to TVM's default schedule; then one run on random inputs and the
comparison with the float64 reference (``compare``).
"""
from __future__ import annotations

from typing import Optional

import tvm_roller
from tvm_roller.hardware import host_target
from harness.random_cases import compare, faults, families
from harness.random_cases.case import OK, WRONG, Case, Result
from harness.random_cases.outcome import classify
from harness.random_cases.steps import StepHook, Steps


def check(case: Case, on_step: Optional[StepHook] = None) -> Result:
    steps = Steps(on_step)
    try:
        with steps.step("func"):
            built = families.build(case)
            func = families.prim_func(built)
            out_spec = compare.specs(built)[-1]
            arrays = compare.inputs(case, built)
        with steps.step("build"):
            faults.before_step(case)
            lib = tvm_roller.build(func, host_target(), fallback=False)
        with steps.step("run"):
            out = faults.perturb(case, compare.run(lib, arrays, out_spec))
        with steps.step("reference"):
            ref = compare.reference(case, arrays)
    except Exception as err:  # every failure becomes a classified result
        outcome, message = classify(err, steps.stage)
        return Result(case, outcome, message, steps.stage, seconds=steps.elapsed(),
                      facts=steps.times)
    err = compare.error(out, ref)
    tol = compare.tolerance(out_spec[1], built.reduction)
    if err <= tol:
        return Result(case, OK, "", "compare", err, tol, steps.elapsed(), steps.times)
    return Result(case, WRONG, compare.mismatch(out, ref, tol), "compare", err, tol,
                  steps.elapsed(), steps.times)
