"""Target kind -> backend: the one place where the strings "llvm" and "cuda" pick code.

Adding a backend: a folder ``backends/<family>/`` with a :class:`~.base.Backend` subclass, and one
line in ``_BACKENDS`` below. The registry takes the ``Target`` the planner's context made
(``hardware.normalize_target``): it normalises nothing itself.
"""
from __future__ import annotations

from typing import Dict

import tvm

from tvm_roller.backends.base import Backend
from tvm_roller.backends.cpu import CpuBackend
from tvm_roller.backends.cuda import CudaBackend
from tvm_roller.core.errors import UnsupportedError

_BACKENDS: Dict[str, Backend] = {
    "llvm": CpuBackend(),
    "cuda": CudaBackend(),
}


def target_kinds() -> tuple:
    """The TVM target kinds roller has a backend for."""
    return tuple(_BACKENDS)


def backend_for(target: tvm.target.Target) -> Backend:
    """The backend of a normalised ``target``; UnsupportedError for a kind roller has none for."""
    if not isinstance(target, tvm.target.Target):
        raise TypeError(f"backend_for takes a tvm.target.Target (tvm_roller.hardware."
                        f"normalize_target makes one), got {type(target).__name__}")
    kind = target.kind.name
    if kind not in _BACKENDS:
        raise UnsupportedError(f"target kind {kind!r} has no roller backend "
                               f"(supported: {', '.join(_BACKENDS)})")
    return _BACKENDS[kind]


def has_backend(target: tvm.target.Target) -> bool:
    return target.kind.name in _BACKENDS
