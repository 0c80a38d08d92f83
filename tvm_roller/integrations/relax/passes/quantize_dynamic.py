"""int8 dynamic quantization of compute-bound linear layers, for AMX (``weights="int8"``).

A linear layer over a constant weight whose activation rows are static and many (a BERT's 128
tokens, not an LLM's decode step) is a GEMM: it runs fastest as one int8 × int8 → int32 tile
product (roller's AMX rule) with the dequantization as its epilogue. Each such layer becomes

    s_x = max(|x|, row) / 127                       (per row, at run time)
    x_q = int8(clip(round(x / s_x), -127, 127))
    y   = float32(matmul(x_q, w_q, int32)) · s_x · s_w

with ``w_q = round(w / s_w)``, ``s_w = max(|w|, column) / 127`` per output channel (symmetric:
zero points would cost a correction GEMV per layer). These are plain Relax ops: the pipeline
fuses the scaling into the GEMM's write-back and the quantization of ``x`` into one kernel.
Per-row activation scales are finer than ONNX Runtime's per-tensor dynamic quantization.

A convolution (NCHW, one group, a constant weight) is quantized the same way with one scale
for the whole activation tensor (its rows are pixels): ``float32(conv2d(x_q, w_q, int32)) · s_x
· s_w[channel]``; the pipeline then turns the int8 convolution into an im2col GEMM
(``conv_gemm``) on the same tile products.

Layers with few or symbolic rows (memory-bound: decode, GEMV) are left to the group-quantized
integer kernels (``quantize_weights``), which read fewer bytes per weight.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from tvm_roller.integrations.relax.passes.quantize_weights import QuantDecision, \
    float_rows, is_transpose

#: activation rows from which a layer is a GEMM for the tile products (two AMX tiles' rows)
MIN_ROWS = 32


def _static_rows(x: relax.Expr) -> Optional[int]:
    shape = getattr(x.ty, "shape", None)
    dims = list(shape) if shape is not None else []
    if not dims or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return int(np.prod([int(d) for d in dims[:-1]]))


def _quantize_weight(w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``w [k, n]`` → int8 codes [k, n] and float32 scales [n] (per output channel)."""
    scale = np.abs(w).max(axis=0) / 127.0
    scale[scale == 0] = 1.0
    codes = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return codes, scale.astype(np.float32)


def _quantize_activation(x: relax.Expr, axis) -> Tuple[relax.Expr, relax.Expr]:
    """(int8 codes, float32 scale) of ``x``, one scale per slice reduced over ``axis``."""
    amax = relax.op.max(relax.op.abs(x), axis=axis, keepdims=True)
    sx = relax.op.maximum(relax.op.divide(amax, relax.const(127.0, "float32")),
                          relax.const(1e-30, "float32"))
    xq = relax.op.astype(relax.op.clip(relax.op.round(relax.op.divide(x, sx)), -127, 127), "int8")
    return xq, sx


def _dequantize(acc: relax.Expr, sx: relax.Expr, sw: Constant) -> relax.Expr:
    return relax.op.multiply(relax.op.multiply(relax.op.astype(acc, "float32"), sx), sw)


def _dynamic_linear(x: relax.Expr, codes: Constant, scale: Constant) -> relax.Expr:
    xq, sx = _quantize_activation(x, -1)
    return _dequantize(relax.op.matmul(xq, codes, out_dtype="int32"), sx, scale)


def _dynamic_conv(call: relax.Call, codes: Constant, scale: Constant) -> relax.Expr:
    a = call.attrs
    xq, sx = _quantize_activation(call.args[0], None)
    acc = relax.op.nn.conv2d(xq, codes, strides=a.strides, padding=a.padding,
                             dilation=a.dilation, groups=a.groups, data_layout="NCHW",
                             kernel_layout="OIHW", out_dtype="int32")
    return _dequantize(acc, sx, scale)


def _quantizable_conv(call: relax.Call) -> bool:
    a, x, w = call.attrs, call.args[0], call.args[1]
    out = getattr(call.ty, "shape", None)
    dims = list(out) if out is not None else []
    rows = None
    if len(dims) == 4 and all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        rows = int(dims[0]) * int(dims[2]) * int(dims[3])  # N·H·W: the GEMM's rows
    return isinstance(w, Constant) and str(x.ty.dtype) == "float32" and \
        str(w.ty.dtype) == "float32" and int(a.groups) == 1 and a.data_layout == "NCHW" and \
        a.kernel_layout == "OIHW" and (a.out_layout or "NCHW") == "NCHW" and \
        rows is not None and rows >= MIN_ROWS


def quantize_gemms(mod: tvm.IRModule, decisions: Optional[List[QuantDecision]] = None
                   ) -> tvm.IRModule:
    """The rewrite above on every Relax function's constant linear layers and convolutions
    with at least ``MIN_ROWS`` static rows; ``decisions`` gets one entry per weight rewritten."""
    mod = mod.clone()
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = _rewrite(func, decisions)
    return mod


def _rewrite(func: relax.Function, decisions: Optional[List[QuantDecision]]) -> relax.Function:
    packed: Dict[Constant, Tuple[Constant, Constant]] = {}
    x, w = wildcard(), wildcard()
    transpose = is_op("relax.permute_dims")(w)
    linear = is_op("relax.matmul")(x, transpose)  # x · wᵀ, w [n, k]
    plain = is_op("relax.matmul")(x, w)  # x · c, c [k, n]

    def layer(expr, matches, kn_of):
        rows = _static_rows(matches[x])
        const = matches[w]
        if not float_rows(expr) or rows is None or rows < MIN_ROWS or \
                not isinstance(const, Constant) or len(const.ty.shape) != 2 or \
                str(const.ty.dtype) != "float32":
            return expr
        if const not in packed:
            kn = np.ascontiguousarray(kn_of(const.value.numpy()), dtype=np.float32)
            codes, scale = _quantize_weight(kn)
            packed[const] = (relax.const(codes), relax.const(scale))
            if decisions is not None:
                k, n = kn.shape
                decisions.append(QuantDecision(f"constant[{n}x{k}]", (n, k), "int8-channel",
                                               None))
        return _dynamic_linear(matches[x], *packed[const])

    def on_linear(expr, matches):
        if not is_transpose(matches[transpose]):
            return expr
        return layer(expr, matches, lambda a: a.T)

    conv = is_op("relax.nn.conv2d")(x, w)

    def on_conv(expr, matches):
        if not _quantizable_conv(expr):
            return expr
        const = matches[w]
        if const not in packed:
            oihw = const.value.numpy().astype(np.float32)
            codes, scale = _quantize_weight(oihw.reshape(oihw.shape[0], -1).T)
            packed[const] = (relax.const(codes.T.reshape(oihw.shape)),
                             relax.const(scale.reshape(1, -1, 1, 1)))
            if decisions is not None:
                co, rest = oihw.shape[0], int(np.prod(oihw.shape[1:]))
                decisions.append(QuantDecision(f"conv constant[{'x'.join(map(str, oihw.shape))}]",
                                               (co, rest), "int8-channel", None))
        return _dynamic_conv(expr, *packed[const])

    func = rewrite_call(linear, on_linear, func)
    func = rewrite_call(conv, on_conv, func)
    return rewrite_call(plain, lambda e, m: layer(e, m, lambda a: a), func)
