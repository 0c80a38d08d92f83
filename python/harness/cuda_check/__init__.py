"""The CUDA check toolchain of the development harness: checks of generated CUDA without a GPU,
and the bundles a lent GPU machine runs without TVM. Not imported by the library (``tvm_roller``).

* ``build``      lower a scheduled module, its kernel launches (:class:`KernelBundle`),
                 ``verify_gpu_code``, nvcc/ptxas (``compile_cubin``), all in one ``check``;
                 ``check_executable``: nvcc on every kernel of an already built module.
* ``replica``    ``cpu_replica``: the same schedule as a CPU program LLVM builds.
* ``gpu_check``  the device check (``python/gpu_check.py`` is its command line): ``build``
                 writes bundles here, ``run`` times them on the GPU machine with CuPy/PyTorch.
                 Its parts: ``gpu_manifest`` (the bundle directory), ``gpu_bundles`` (build),
                 ``gpu_launch``, ``gpu_reference``, ``gpu_timing``, ``gpu_micro``,
                 ``gpu_measure`` and ``gpu_report`` (run).

The names below are re-exported lazily, on first use: ``gpu_check``'s run half must import with
neither TVM nor tvm_roller (``build`` and ``replica`` import TVM).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

_EXPORTS = {
    "check": "build", "check_executable": "build", "compile_cubin": "build",
    "compile_ptx": "build", "kernel_launches": "build", "lower": "build",
    "nvcc_supports": "build", "nvcc_version": "build", "ptx_tensor_core": "build",
    "verify": "build",
    "CheckReport": "build", "CudaCompileError": "build", "KernelBundle": "build",
    "PtxasReport": "build",
    "cpu_replica": "replica",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs only
    from harness.cuda_check.build import (CheckReport, CudaCompileError, KernelBundle,
                                          PtxasReport, check, check_executable,
                                          compile_cubin, compile_ptx, kernel_launches,
                                          lower, nvcc_supports, nvcc_version,
                                          ptx_tensor_core, verify)
    from harness.cuda_check.replica import cpu_replica


def __getattr__(name: str) -> Any:
    sub = _EXPORTS.get(name)
    if sub is None:  # also how ``from harness.cuda_check import build`` finds the submodule
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{sub}"), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_EXPORTS))
