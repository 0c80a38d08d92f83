"""tvm_ffi containers as plain Python data (what JSON and keys are made of)."""
from __future__ import annotations

from typing import Any

from tvm.target import Target


def plain(obj: Any) -> Any:
    """tvm_ffi Map/Array (e.g. from ``Target.export()``) -> dict/list, recursively."""
    if isinstance(obj, (str, bytes, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, Target):
        return plain(obj.export())
    if hasattr(obj, "items"):
        return {str(k): plain(v) for k, v in obj.items()}
    if hasattr(obj, "__iter__"):
        return [plain(v) for v in obj]
    return obj
