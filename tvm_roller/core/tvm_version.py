"""Refuse known-bad TVM / tvm-ffi combinations before they crash the process.

apache-tvm-ffi 0.1.15.x (what pip picks by default for apache-tvm 0.27) segfaults in
``tvm.ir.save_json`` (``tvm::ffi::ToJSONGraph``) on any object, which takes down MetaSchedule's
JSON database and anything that serializes IR. A segfault can't be caught, so check up front.
"""
from __future__ import annotations

import re
from importlib import metadata
from typing import Optional, Tuple

SUPPORTED_TVM = "0.27"
PINNED_FFI = "0.1.14.post1"
FIX = f"pip install 'apache-tvm==0.27.0.post1' 'apache-tvm-ffi=={PINNED_FFI}'"


def _dist_version(*names: str) -> Optional[str]:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _major_minor_patch(v: str) -> Tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", v)
    return tuple(int(x) for x in m.groups(default="0")) if m else ()


def check_tvm_ffi(tvm_version: Optional[str] = None, ffi_version: Optional[str] = None) -> None:
    """Raise ImportError (with the fix) if tvm-ffi is 0.1.15.x or TVM is not 0.27.x.

    Versions come from the installed distributions' metadata (no import); the arguments exist
    for testing. A TVM without pip metadata (a source build) is checked via ``tvm.__version__``.
    """
    ffi = ffi_version if ffi_version is not None else _dist_version("apache-tvm-ffi", "tvm-ffi", "tvm_ffi")
    if ffi is not None and _major_minor_patch(ffi)[:3] == (0, 1, 15):
        raise ImportError(
            f"tvm-roller: apache-tvm-ffi {ffi} is installed; 0.1.15.x segfaults in "
            f"tvm.ir.save_json (tvm::ffi::ToJSONGraph), which crashes MetaSchedule's database "
            f"and IR serialization. Install the pinned version: {FIX}")
    tv = tvm_version if tvm_version is not None else _dist_version("apache-tvm", "tvm")
    if tv is None:
        import tvm  # source build without dist metadata

        tv = str(getattr(tvm, "__version__", ""))
    if _major_minor_patch(tv)[:2] != _major_minor_patch(SUPPORTED_TVM)[:2]:
        raise ImportError(
            f"tvm-roller needs Apache TVM {SUPPORTED_TVM}.x (tvm.tirx / tvm.s_tir APIs); "
            f"found {tv or 'unknown'}. {FIX}")
