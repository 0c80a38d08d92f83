"""Pack a constant operand once, at compile time, instead of in every call.

The micro-kernel streams a reused operand from a panel layout ``(last // panel, ...,
last % panel)`` (``lower._pack_operand``: each task copies its slice in every call). When the
operand is a parameter the caller binds to a constant (a model's weight: Relax's
``AttachAttrLayoutFreeBuffers`` lists it in the function's ``layout_free_buffers``), the
whole buffer is packed by one block marked ``meta_schedule.layout_rewrite_preproc``; the
Relax pipeline splits that block into its own function (``SplitLayoutRewritePreproc``) and
``FoldConstant`` runs it while compiling, so the kernel reads a packed constant.
"""
from __future__ import annotations

from typing import List, Optional

from tvm import s_tir, tirx

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.constants import layout_free_param

#: the block annotation Relax's SplitLayoutRewritePreproc moves into a function of its own
PREPROC = "meta_schedule.layout_rewrite_preproc"


def panel_operands(fa: FuncAnalysis, vector_axis: Optional[int]) -> List[str]:
    """The main block's operands the micro-kernel streams by panels: read along the vector
    axis (contiguous) and reused over a reduction axis (a GEMM's B, a convolution's weight)."""
    if vector_axis is None:
        return []
    reduction = set(fa.reduction)
    return [a.buffer for a in fa.reads
            if a.innermost_axis() == vector_axis and reduction & set(a.axes_used())]


def prepack(sch: s_tir.Schedule, func: tirx.PrimFunc, main, name: str, panel: int) -> bool:
    """Pack operand ``name`` of block ``main`` into panels of ``panel`` elements at compile
    time (see the module docstring); False (nothing changed) when it is not a constant
    parameter read directly, or its last extent is not a multiple of ``panel``."""
    regions = sch.get(main).reads
    reads = [str(r.source.name) for r in regions]
    if name not in reads or layout_free_param(func, regions[reads.index(name)].source) is None:
        return False
    last = regions[reads.index(name)].source.ty.shape[-1]
    if not isinstance(last, tirx.IntImm) or int(last) % panel:
        return False
    cb = sch.cache_read(main, reads.index(name), "global")
    sch.transform_layout(cb, ("write", 0),
                         lambda *idx: (idx[-1] // panel, *idx[:-1], idx[-1] % panel))
    sch.annotate(cb, PREPROC, True)
    return True
