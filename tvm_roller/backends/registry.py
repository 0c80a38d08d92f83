"""Target kind -> backend: the one place where the strings "llvm" and "cuda" pick code.

Adding a backend: a folder ``backends/<family>/`` with a :class:`~.base.Backend` subclass, and one
line in ``_BACKENDS`` below.
"""
from __future__ import annotations

from typing import Dict

import tvm

from tvm_roller.backends.base import Backend
from tvm_roller.backends.cpu import CpuBackend
from tvm_roller.backends.cuda import CudaBackend
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.types import TargetLike
from tvm_roller.hardware.cpu import normalize_target
from tvm_roller.hardware.model import DeviceModel

_BACKENDS: Dict[str, Backend] = {
    "llvm": CpuBackend(),
    "cuda": CudaBackend(),
}


def target_kinds() -> tuple:
    """The TVM target kinds roller has a backend for."""
    return tuple(_BACKENDS)


def backend_for(target: TargetLike) -> Backend:
    """The backend of ``target`` (a Target, its dict form or a kind / tag string)."""
    tgt = target if isinstance(target, tvm.target.Target) else normalize_target(target)
    kind = tgt.kind.name
    if kind not in _BACKENDS:
        raise UnsupportedError(f"target kind {kind!r} has no roller backend "
                               f"(supported: {', '.join(_BACKENDS)})")
    return _BACKENDS[kind]


def has_backend(target: tvm.target.Target) -> bool:
    return target.kind.name in _BACKENDS


def device_model(target: TargetLike) -> DeviceModel:
    """The device model of a target (a preset, the host's /sys or a calibration; no live
    device)."""
    tgt = normalize_target(target)
    return backend_for(tgt).device_model(tgt)


def host_target() -> tvm.target.Target:
    """The target of the machine roller runs on (an llvm target completed from the host): the
    default wherever a command or function is given none."""
    return normalize_target("llvm")
