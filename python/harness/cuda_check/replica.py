"""A CPU replica of a CUDA schedule: the same loop nest and index arithmetic, run sequentially.

A scheduled TIR module means the same thing whether its thread-bound loops run in parallel or one
after another: a shared-memory tile fetched cooperatively is, sequentially, a loop that fetches
the whole tile; a reduction bound to threads is a reduction loop. Rewriting the thread bindings
to serial loops and the shared/local buffers to global ones gives a program LLVM builds, so
roller's tiling, padding, inlined prologues, folded epilogues and split reductions can be checked
against a float64 reference on a machine without a GPU.

What it cannot check is what only the GPU does: barriers and races, TVM's warp-shuffle lowering,
cp.async, vector alignment and tensor-core intrinsics (``python/gpu_check.py`` runs those).
"""
from __future__ import annotations

import re
import sys

import tvm

from tvm_roller.core.errors import UnsupportedError

_THREAD_LOOP = re.compile(r'T\.thread_binding\(((?:[^(),]|\([^()]*\))+),\s*thread="[^"]+"')
_GPU_SCOPE = re.compile(r'scope="(shared|shared\.dyn|local|warp)"')
# software pipelining needs thread synchronisation, which an LLVM (CPU) build cannot emit;
# it reorders the fetches only, so the replica drops it
_PIPELINE = re.compile(r'"software_pipeline_\w+":\s*\[[^\]]*\],?\s*')
# TVM 0.27's parser range-checks a float64 literal against float32 and rejects the printed
# +-DBL_MAX of a float64 max/min reduction's init: print it as T.max_value / T.min_value
_FLOAT64_LIMIT = re.compile(r"T\.float64\((-?)(\d{300,}\.0)\)")
_GPU_ONLY = ("tvm_load_matrix_sync", "tvm_mma_sync", "tvm_fill_fragment", "tvm_store_matrix_sync",
             "ptx_", "mma_", "wmma")


def cpu_replica(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (scheduled for CUDA, not yet lowered) as a module LLVM can build and run."""
    text = mod.script()
    if any(name in text for name in _GPU_ONLY):
        raise UnsupportedError("the schedule uses tensor-core intrinsics: no CPU replica")
    text = _THREAD_LOOP.sub(lambda m: f"T.serial({m.group(1)}", text)
    text = _GPU_SCOPE.sub('scope="global"', text)
    text = _PIPELINE.sub("", text)
    text = _FLOAT64_LIMIT.sub(_float64_limit, text)
    left = [k for k in ("thread_binding", 'scope="shared', 'scope="local"') if k in text]
    if left:
        raise UnsupportedError(f"CPU replica: could not rewrite {left}")
    return tvm.script.from_source(text)


def _float64_limit(m: "re.Match") -> str:
    if float(m.group(2)) != sys.float_info.max:
        return m.group(0)  # another huge literal: left for the parser to judge
    return 'T.min_value("float64")' if m.group(1) else 'T.max_value("float64")'
