"""Single fused PrimFuncs as roller's Relax pipeline hands them over (LegalizeOps, FuseOps,
FuseTIR: int64 extents, epilogues fused), built from a few Relax ops, for tests and benchmarks."""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relax


def fused_prim_func(body: Callable, inputs: Sequence[Tuple[str, Sequence[int]]],
                    dtype: str = "float32") -> tvm.tirx.PrimFunc:
    """The one PrimFunc FuseTIR makes of ``body(bb, *params)`` (which emits Relax ops with
    ``bb`` and returns the result), its parameters named and shaped by ``inputs``."""
    bb = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(tuple(shape), dtype)) for name, shape in inputs]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()])(
            bb.get())
    prims = [(gv.name_hint, f) for gv, f in mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    fused = [f for name, f in prims if name.startswith("fused")] or [f for _, f in prims]
    if len(fused) != 1:
        raise ValueError(f"expected one fused PrimFunc, got {[name for name, _ in prims]}")
    return fused[0].with_attr("global_symbol", "main")


def channels_last_conv(dims: int, n: int, cin: int, size: int, cout: int, k: int, s, p, g: int,
                       relu: bool = True, dtype: str = "float32", d=1,
                       weights: Optional[Tuple[np.ndarray, np.ndarray]] = None
                       ) -> tvm.tirx.PrimFunc:
    """pad + conv (NHWC/HWIO for ``dims`` 2, NWC/WIO for 1) + bias add (+ ReLU), fused. The
    weight and bias are parameters after the input, or constants when ``weights`` gives them."""
    xshape = (n,) + (size,) * dims + (cin,)
    wshape = (k,) * dims + (cin // g, cout)

    def body(bb, x, *wb):
        w, b = wb if weights is None else (relax.const(weights[0]), relax.const(weights[1]))
        if dims == 2:
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=s, padding=p, dilation=d, groups=g,
                                           data_layout="NHWC", kernel_layout="HWIO"))
        else:
            y = bb.emit(relax.op.nn.conv1d(x, w, strides=s, padding=p, dilation=d, groups=g,
                                           data_layout="NWC", kernel_layout="WIO"))
        y = bb.emit(relax.op.add(y, b))
        return bb.emit(relax.op.nn.relu(y)) if relu else y

    inputs = [("x", xshape)] + ([("w", wshape), ("b", (cout,))] if weights is None else [])
    return fused_prim_func(body, inputs, dtype)
