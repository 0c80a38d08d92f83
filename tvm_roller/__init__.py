"""tvm-roller: ROLLER-style constructed schedules for Apache TVM.

Builds a schedule from hardware-aligned tiles (rTiles) in well under a second instead of searching,
for TVM's LLVM backend (CUDA follows). Plans offline from a device model: no live device needed.
"""
__version__ = "0.1.0"

from ._version_check import check_tvm_ffi as _check_tvm_ffi

_check_tvm_ffi()

from . import hardware  # noqa: E402
from .api import build, explain, plan, schedule  # noqa: E402
from .errors import FallbackWarning, UnsupportedError  # noqa: E402
from .rtile import RTile  # noqa: E402

__all__ = ["schedule", "build", "explain", "plan", "UnsupportedError", "FallbackWarning", "RTile",
           "hardware", "__version__"]
