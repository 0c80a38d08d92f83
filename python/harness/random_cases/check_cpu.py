"""One case on the CPU: roller's build against TVM's unscheduled float64 build.

``tvm_roller.build(func, target, fallback=False)``, so a decline is a visible outcome rather
than a silent fallback to TVM's default schedule; then one run on random inputs and the
comparison with the float64 reference (``compare``). The target is the host's, or the case's
``llvm_target`` (``--llvm-target``): where this host cannot run that target's code
(``targets.can_run``: another architecture, or instruction-set features the host lacks) the
kernel is compiled to an object file and the case is *not_run* ("built, not run"), neither ok
nor wrong.

A Relax family's case (``attention``) is a whole model instead: compiled by roller's pipeline
(``tvm_roller.relax.compile``), run by the VM and compared with its float64 numpy reference;
a function roller failed on inside it (the pipeline's ``error`` fallback) is an *error*.
"""
from __future__ import annotations

import os
import tempfile
import warnings
from typing import Any, Dict, List, Optional

import numpy as np

import tvm_roller
import tvm_roller.relax as roller_relax
from harness.random_cases import attention, compare, faults, families, targets
from harness.random_cases.case import NOT_RUN, OK, WRONG, Case, Result
from harness.random_cases.outcome import classify
from harness.random_cases.steps import StepHook, Steps


def machine_code(lib, asm: bool) -> Optional[str]:
    """Compile ``lib`` (what ``tvm.compile`` returns) to an object file, the step a module
    this host cannot load never reaches otherwise; its assembly too when ``asm``."""
    return module_code(lib.mod, asm)


def module_code(mod, asm: bool) -> Optional[str]:
    """:func:`machine_code` of an llvm runtime module."""
    with tempfile.TemporaryDirectory(prefix="roller-case-") as tmp:
        mod.write_to_file(os.path.join(tmp, "case.o"))
    return mod.inspect_source("asm") if asm else None


def _not_run(case: Case, tgt, code, steps: Steps, facts: Dict[str, Any]) -> Optional[Result]:
    """The *not_run* result of a case built for a target this host cannot run (``code``: its
    llvm module, compiled to machine code to find out where the assembly decides); None when
    the host runs it. ``facts`` gets the verdict."""
    verdict = targets.can_run(tgt)
    if not verdict.ok:
        with steps.step("codegen"):
            asm = module_code(code, targets.needs_asm(tgt))
        verdict = targets.can_run(tgt, asm)
    facts["runs_here"] = verdict.reason
    if verdict.ok:
        return None
    return Result(case, NOT_RUN, f"built, not run: {verdict.reason}", "codegen",
                  seconds=steps.elapsed(), facts={**steps.times, **facts})


def _compared(case: Case, out: np.ndarray, ref: np.ndarray, tol: float, steps: Steps,
              facts: Dict[str, Any]) -> Result:
    """OK or WRONG: ``out`` against the float64 reference ``ref``."""
    facts = {**steps.times, **facts}
    err = compare.error(out, ref)
    if err <= tol:
        return Result(case, OK, "", "compare", err, tol, steps.elapsed(), facts)
    return Result(case, WRONG, compare.mismatch(out, ref, tol), "compare", err, tol,
                  steps.elapsed(), facts)


def _failed(case: Case, err: Exception, steps: Steps, facts: Dict[str, Any]) -> Result:
    """The classified result of ``err``, raised in the step running now."""
    outcome, message = classify(err, steps.stage)
    return Result(case, outcome, message, steps.stage, seconds=steps.elapsed(),
                  facts={**steps.times, **facts})


def check(case: Case, on_step: Optional[StepHook] = None) -> Result:
    if families.FAMILIES[case.family].relax:
        return check_model(case, on_step)
    steps = Steps(on_step)
    facts: Dict[str, Any] = {}
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
            not_run = _not_run(case, tgt, lib.mod, steps, facts)
            if not_run is not None:
                return not_run
        with steps.step("run"):
            out = faults.perturb(case, compare.run(lib, arrays, out_spec))
        with steps.step("reference"):
            ref = compare.reference(case, arrays)
    except Exception as err:  # every failure becomes a classified result
        return _failed(case, err, steps, facts)
    return _compared(case, out, ref, compare.tolerance(out_spec[1], built.reduction), steps,
                     facts)


def check_model(case: Case, on_step: Optional[StepHook] = None) -> Result:
    """A Relax family's case (``attention``): the model compiled whole by roller's pipeline
    (``tvm_roller.relax.compile``, no cache: planned afresh), run by the VM and compared with
    the float64 numpy reference. The facts say how the flash-attention pass built it."""
    steps = Steps(on_step)
    facts: Dict[str, Any] = {}
    try:
        with steps.step("func"):
            mod = attention.module(case)
            arrays = attention.inputs(case)
            tgt = targets.target(case.llvm_target)
        with steps.step("build"):
            faults.before_step(case)
            report: List[dict] = []
            chains: List[dict] = []
            with warnings.catch_warnings():  # a fallback is in the report, and in the facts
                warnings.simplefilter("ignore", tvm_roller.FallbackWarning)
                ex = roller_relax.compile(mod, tgt, report, cache=False, chains=chains)
            facts.update(attention.route(chains, report))
            attention.check_report(report)
        if case.llvm_target:  # (the VM executable's kernels are its one llvm module)
            not_run = _not_run(case, tgt, ex.mod.imports[0], steps, facts)
            if not_run is not None:
                return not_run
        with steps.step("run"):
            out = faults.perturb(case, attention.run(ex, arrays))
        with steps.step("reference"):
            ref = attention.reference(case, arrays)
    except Exception as err:  # every failure becomes a classified result
        return _failed(case, err, steps, facts)
    return _compared(case, out, ref,
                     compare.tolerance(case.dtype, attention.reduction(case.params)), steps,
                     facts)
