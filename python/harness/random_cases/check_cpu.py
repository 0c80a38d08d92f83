"""One case on the CPU: roller's build against TVM's unscheduled float64 build.

``tvm_roller.build(func, target, fallback=False)``, so a decline is a visible outcome rather
than a silent fallback to TVM's default schedule; then one run on random inputs and the
comparison with the float64 reference (``compare``). The target is the host's, or the case's
``llvm_target`` (``--llvm-target``): where this host cannot run that target's code
(``targets.can_run``: another architecture, or instruction-set features the host lacks) the
kernel is compiled to an object file and the case is *not_run* ("built, not run"), neither ok
nor wrong.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional

import tvm_roller
from harness.random_cases import compare, faults, families, targets
from harness.random_cases.case import NOT_RUN, OK, WRONG, Case, Result
from harness.random_cases.outcome import classify
from harness.random_cases.steps import StepHook, Steps


def machine_code(lib, asm: bool) -> Optional[str]:
    """Compile ``lib`` (what ``tvm.compile`` returns) to an object file, the step a module
    this host cannot load never reaches otherwise; its assembly too when ``asm``."""
    mod = lib.mod
    with tempfile.TemporaryDirectory(prefix="roller-case-") as tmp:
        mod.write_to_file(os.path.join(tmp, "case.o"))
    return mod.inspect_source("asm") if asm else None


def check(case: Case, on_step: Optional[StepHook] = None) -> Result:
    steps = Steps(on_step)
    facts = {}
    try:
        with steps.step("func"):
            built = families.build(case)
            func = families.prim_func(built)
            out_spec = compare.specs(built)[-1]
            arrays = compare.inputs(case, built)
            tgt = targets.target(case.llvm_target)
        with steps.step("build"):
            faults.before_step(case)
            lib = tvm_roller.build(func, tgt, fallback=False)
        if case.llvm_target:
            verdict = targets.can_run(tgt)
            if not verdict.ok:
                with steps.step("codegen"):
                    asm = machine_code(lib, targets.needs_asm(tgt))
                verdict = targets.can_run(tgt, asm)
            facts["runs_here"] = verdict.reason
            if not verdict.ok:
                return Result(case, NOT_RUN, f"built, not run: {verdict.reason}", "codegen",
                              seconds=steps.elapsed(), facts={**steps.times, **facts})
        with steps.step("run"):
            out = faults.perturb(case, compare.run(lib, arrays, out_spec))
        with steps.step("reference"):
            ref = compare.reference(case, arrays)
    except Exception as err:  # every failure becomes a classified result
        outcome, message = classify(err, steps.stage)
        return Result(case, outcome, message, steps.stage, seconds=steps.elapsed(),
                      facts={**steps.times, **facts})
    facts = {**steps.times, **facts}
    err = compare.error(out, ref)
    tol = compare.tolerance(out_spec[1], built.reduction)
    if err <= tol:
        return Result(case, OK, "", "compare", err, tol, steps.elapsed(), facts)
    return Result(case, WRONG, compare.mismatch(out, ref, tol), "compare", err, tol,
                  steps.elapsed(), facts)
