"""What a user hands roller, as the one PrimFunc it plans."""
from __future__ import annotations

import tvm
from tvm import tirx

from tvm_roller.core.errors import UnsupportedError


def unwrap_func(func) -> tirx.PrimFunc:
    """``func`` itself, or the only PrimFunc of an IRModule; UnsupportedError otherwise."""
    if isinstance(func, tvm.IRModule):
        prims = [f for _, f in func.functions_items() if isinstance(f, tirx.PrimFunc)]
        if len(prims) != 1:
            raise UnsupportedError(f"expected an IRModule holding one PrimFunc, got {len(prims)}")
        return prims[0]
    if not isinstance(func, tirx.PrimFunc):
        raise UnsupportedError(f"expected a PrimFunc or IRModule, got {type(func).__name__}")
    return func
