"""Inputs, the float64 reference and the comparison every check shares.

The reference is the same compute in float64 built by plain ``tvm.compile`` for LLVM with no
schedule: TVM's own lowering of the TE, nothing of roller's. The inputs are drawn once in the
case's dtype and cast up, so both sides see the same values. The output buffer starts as NaN:
an element the kernel never writes shows up as an infinite error.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np
import tvm

from harness.random_cases import families
from harness.random_cases.case import Case

# relative error bound per output (accumulator) dtype, for one term; it grows with sqrt(terms)
BASE_TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 2e-3}
REFERENCE_TARGET = "llvm"

Spec = Tuple[Tuple[int, ...], str]


def specs(built: families.Built) -> List[Spec]:
    """(shape, dtype) of every parameter, the output last."""
    return [(tuple(int(s) for s in t.shape), str(t.dtype)) for t in built.tensors]


def inputs(case: Case, built: families.Built) -> List[np.ndarray]:
    """Uniform(-1, 1) arrays for the inputs, never exactly zero (a zero hides a read of
    padding), seeded by the case."""
    return random_arrays(case, specs(built)[:-1])


def random_arrays(case: Case, operands: Sequence[Spec]) -> List[np.ndarray]:
    """:func:`inputs` for the given (shape, dtype) of each input."""
    arrays = []
    for k, (shape, dtype) in enumerate(operands):
        rng = np.random.default_rng([case.seed, case.index, 2, k])
        if dtype in ("int8", "uint8"):  # the whole range (an int8 GEMM must be exact)
            lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
            x = rng.integers(lo, hi, size=shape)
            x[x == 0] = 3
            x = x.astype(dtype)
        else:  # (bfloat16: numpy's ml_dtypes type)
            x = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
            x[x == 0] = 0.5
        arrays.append(x)
    return arrays


def run(lib, arrays: Sequence[np.ndarray], out: Spec) -> np.ndarray:
    """Call ``lib`` (what ``tvm.compile`` returns) on ``arrays`` and a NaN-filled output."""
    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(np.require(a, requirements="C"), dev) for a in arrays]
    fill = np.nan if out[1].startswith("float") else np.iinfo(out[1]).min  # never written: seen
    res = tvm.runtime.tensor(np.full(out[0], fill, dtype=out[1]), dev)
    lib["main"](*args, res)
    return res.numpy()


def reference(case: Case, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The case's compute in float64, unscheduled, on ``arrays`` cast to float64."""
    built = families.build(case, "float64")
    lib = tvm.compile(tvm.IRModule({"main": families.prim_func(built)}), target=REFERENCE_TARGET)
    return run(lib, [a.astype(np.float64) for a in arrays], specs(built)[-1])


def tolerance(dtype: str, reduction: int) -> float:
    """The bound on :func:`error` for an output of ``dtype`` summing ``reduction`` terms; an
    integer output (an argmax's index) must be exact."""
    if not dtype.startswith("float"):
        return 0.0
    return BASE_TOL.get(dtype, BASE_TOL["float16"]) * math.sqrt(max(1, reduction))


def error(out: np.ndarray, ref: np.ndarray) -> float:
    """Max over elements of ``|out - ref| / (|ref| + rms(ref))``: relative where the reference
    is large, absolute (on the output's own scale) where it cancels to near zero. Infinite
    when an element is NaN or infinite (never written) or the shapes differ."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        return math.inf
    if out.size == 0:
        return 0.0
    rms = float(np.sqrt(np.mean(ref * ref)))
    denom = np.abs(ref) + max(rms, 1e-300)
    return float(np.max(np.abs(out - ref) / denom))


def mismatch(out: np.ndarray, ref: np.ndarray, tol: float) -> str:
    """Where ``out`` is off: how many elements exceed ``tol``, and the worst one."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        return f"output shape {out.shape} != reference {ref.shape}"
    bad = ~np.isfinite(out)
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), out.shape)
        return f"{int(bad.sum())} of {out.size} elements not finite (unwritten?), first at {first}"
    rms = max(float(np.sqrt(np.mean(ref * ref))), 1e-300)
    rel = np.abs(out - ref) / (np.abs(ref) + rms)
    worst = np.unravel_index(int(np.argmax(rel)), out.shape)
    return (f"max error {float(rel[worst]):.3g} > tol {tol:.3g} in {int((rel > tol).sum())} of "
            f"{out.size} elements; worst at {tuple(int(i) for i in worst)}: "
            f"{float(out[worst]):.6g} vs {float(ref[worst]):.6g}")
