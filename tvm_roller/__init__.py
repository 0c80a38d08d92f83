"""tvm-roller: ROLLER-style constructed schedules for Apache TVM.

Builds a schedule from hardware-aligned tiles (rTiles) in well under a second instead of searching,
for TVM's LLVM (CPU) and CUDA backends. Plans offline from a device model: no live device needed.

The public functions (``build``, ``explain``, ``plan``, ``schedule``) are the planner's
(``tvm_roller.planner``); ``relax``, ``dlight``, ``meta_schedule`` and ``llm`` are the
integrations. They load on first use, so importing one layer of the package never drags in the
layers above it.
"""
import importlib

from tvm_roller.core.tvm_version import check_tvm_ffi as _check_tvm_ffi
from tvm_roller.core.version import __version__

_check_tvm_ffi()
# importing the package changes no environment: TVM's thread pool is sized by the first call
# into roller (``planner.Context.make`` -> ``hardware.threads.size_thread_pool``)

# name -> the module that defines it (a module itself where the name is a submodule)
_PUBLIC = {
    "build": "tvm_roller.planner.api", "explain": "tvm_roller.planner.api",
    "plan": "tvm_roller.planner.api", "schedule": "tvm_roller.planner.api",
    "UnsupportedError": "tvm_roller.core.errors", "FallbackWarning": "tvm_roller.core.errors",
    "RTile": "tvm_roller.core.rtile",
    "hardware": None, "dlight": None, "relax": None, "meta_schedule": None, "planner": None,
    "llm": None,
}


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tvm_roller' has no attribute {name!r}")
    where = _PUBLIC[name]
    value = importlib.import_module(f"tvm_roller.{name}") if where is None else \
        getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


__all__ = ["schedule", "build", "explain", "plan", "UnsupportedError", "FallbackWarning", "RTile",
           "hardware", "dlight", "relax", "meta_schedule", "llm", "__version__"]
