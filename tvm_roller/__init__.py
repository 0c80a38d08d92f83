"""tvm-roller: ROLLER-style constructed schedules for Apache TVM.

Builds a schedule from hardware-aligned tiles (rTiles) in well under a second instead of searching,
for TVM's LLVM backend (CUDA follows). Plans offline from a device model: no live device needed.
"""
from tvm_roller._version_check import check_tvm_ffi as _check_tvm_ffi
from tvm_roller.core.version import __version__

_check_tvm_ffi()


def _default_thread_count() -> None:
    # TVM's CPU thread pool assumes hyper-threading on x86 and uses half the logical CPUs
    # (one thread on a 2-vCPU machine), fixed at first use. Roller's kernels are planned for
    # every core, so default the pool to all cores unless the user chose otherwise.
    import os

    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(len(os.sched_getaffinity(0)))


_default_thread_count()

# (these cost ~nothing once tvm is imported)
from tvm_roller import dlight, hardware, relax  # noqa: E402
from tvm_roller.api import plan, schedule  # noqa: E402
# build and explain take static functions and functions with symbolic extents alike
from tvm_roller.dynamic import build, explain  # noqa: E402
from tvm_roller.core.errors import FallbackWarning, UnsupportedError  # noqa: E402
from tvm_roller.core.rtile import RTile  # noqa: E402

__all__ = ["schedule", "build", "explain", "plan", "UnsupportedError", "FallbackWarning", "RTile",
           "hardware", "dlight", "relax", "__version__"]
