"""Convolutions to the backend's best layout before legalization (CPU: channels innermost)."""
from __future__ import annotations

import warnings
from typing import Optional

import tvm
from tvm import relax

from tvm_roller.backends.registry import backend_for, has_backend
from tvm_roller.core.errors import FallbackWarning, first_lines


def conv_layout_pass(layouts: Optional[dict] = None) -> tvm.transform.Pass:
    """Convolutions to ``layouts`` (op name -> [data layout, kernel layout]); None: the current
    target's backend's ``conv_layouts`` (none outside a target context or without a backend)."""

    @tvm.transform.module_pass(opt_level=0, name="RollerConvLayout")
    def _convert(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        chosen = layouts
        if chosen is None:
            tgt = tvm.target.Target.current(allow_none=True)
            chosen = backend_for(tgt).conv_layouts if tgt is not None and has_backend(tgt) \
                else {}
        if not chosen or not _calls_any(mod, set(chosen)):
            return mod  # (ConvertLayout itself runs out of memory on some models: DeBERTa)
        try:
            return tvm.transform.Sequential([relax.transform.ConvertLayout(chosen),
                                             relax.transform.FoldConstant()])(mod)
        except RuntimeError as err:  # TVM's pass failed (InternalError): layouts kept
            warnings.warn(f"convolution layout conversion failed ({type(err).__name__}: "
                          f"{first_lines(err)}); the model's layouts are kept",
                          FallbackWarning, stacklevel=2)
            return mod

    return _convert


def _calls_any(mod: tvm.IRModule, op_names: set) -> bool:
    found = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(
                e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in op_names
                else None)
    return bool(found)
