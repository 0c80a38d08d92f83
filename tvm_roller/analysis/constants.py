"""Which parameters of a function its callers bind to constants.

Relax's ``AttachAttrLayoutFreeBuffers`` lists, in a PrimFunc's ``layout_free_buffers``, the
positions of the parameters every caller passes a constant (a model's weight). A copy of such a
parameter (a packing, a padding) is made once, while compiling, not in every call.
"""
from __future__ import annotations

from typing import Optional, Set

from tvm import tirx


def _free_positions(func: tirx.PrimFunc) -> Set[int]:
    free = func.attrs.get("layout_free_buffers") if func.attrs is not None else None
    return {int(i) for i in (free or ())}


def constant_params(func: tirx.PrimFunc) -> Set[str]:
    """Names of the parameters bound to constants (0.27: a parameter is its buffer)."""
    params = list(func.params)
    return {str(params[i].name) for i in _free_positions(func)}


def constant_operand(func: tirx.PrimFunc, name: str) -> bool:
    """Whether the parameter named ``name`` is bound to a constant."""
    return name in constant_params(func)


def layout_free_param(func: tirx.PrimFunc, source) -> Optional[int]:
    """The position of parameter ``source`` (a buffer the kernel reads) when it is bound to a
    constant, else None."""
    free = _free_positions(func)
    return next((i for i, p in enumerate(func.params) if p.same_as(source) and i in free), None)
