"""Inference-time simplifications of an imported model's Relax graph, run before the layout
conversion and legalization, so that every convolution's epilogue fuses into it:

- ``batch_norm`` with constant statistics and ``training=False`` becomes a multiply and an add
  by per-channel constants (its legalized form returns a tuple, which FuseOps cannot fuse into
  the convolution before it: it ran as a separate pass over the activations);
- an explicit zero ``pad`` of the spatial dimensions feeding a convolution (TF-style "same"
  padding, as HuggingFace's MobileNet and EfficientNet write it) becomes that convolution's own
  padding (otherwise a separate copy of the activations, in the model's layout, with transposes
  around it once the convolutions are channels-last);
- ``clip`` (ReLU6, hardtanh) becomes a maximum and a minimum with scalar constants: the layout
  conversion has no rule for ``clip`` and would put a transpose on each side of every one;
- ``power`` by a constant 2, 3 or 4 (GPT-2's tanh-form GELU: ``x ** 3``) becomes products: the
  libm ``powf`` call does not vectorize, and took 14% of GPT-2's time.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import TupleGetItemPattern, is_const, is_op, rewrite_call, wildcard

# spatial axes of each data layout the importer produces, and the conv attribute's order
_SPATIAL = {"NCHW": (2, 3), "NHWC": (1, 2), "NCW": (2,), "NWC": (1,)}


def _const(expr) -> Optional[np.ndarray]:
    return expr.value.numpy() if isinstance(expr, tvm.ir.expr.GenericConst) else None


def _batch_norm_as_scale_shift(func: relax.Function) -> relax.Function:
    x, gamma, beta, mean, var = wildcard(), is_const(), is_const(), is_const(), is_const()
    bn = is_op("relax.nn.batch_norm")(x, gamma, beta, mean, var)
    pattern = TupleGetItemPattern(bn, 0)

    def rewrite(expr, matches):
        attrs = matches[bn].attrs
        if bool(attrs.training):
            return expr
        data = matches[x]
        ndim = len(data.ty.shape)
        axis = int(attrs.axis) % ndim
        g, b, m, v = (_const(matches[p]).astype(np.float64) for p in (gamma, beta, mean, var))
        scale = (g if attrs.scale else np.ones_like(g)) / np.sqrt(v + float(attrs.epsilon))
        shift = (b if attrs.center else np.zeros_like(b)) - m * scale
        shape = [1] * ndim
        shape[axis] = -1
        dtype = str(data.ty.dtype)
        if dtype in ("bfloat16", "float16"):  # in float32, rounded once (as batch_norm does)
            s = relax.const(scale.reshape(shape).astype("float32"))
            t = relax.const(shift.reshape(shape).astype("float32"))
            wide = relax.op.add(relax.op.multiply(relax.op.astype(data, "float32"), s), t)
            return relax.op.astype(wide, dtype)
        s = relax.const(scale.reshape(shape).astype(dtype))
        t = relax.const(shift.reshape(shape).astype(dtype))
        return relax.op.add(relax.op.multiply(data, s), t)

    return rewrite_call(pattern, rewrite, func)


def _pad_into_conv(func: relax.Function, op_name: str) -> relax.Function:
    data, weight = wildcard(), wildcard()
    pad = is_op("relax.nn.pad")(data)
    conv = is_op(op_name)(pad, weight)
    make = relax.op.nn.conv2d if op_name == "relax.nn.conv2d" else relax.op.nn.conv1d

    def rewrite(expr, matches):
        p, c = matches[pad], matches[conv]
        spatial = _SPATIAL.get(str(c.attrs.data_layout))
        width = [int(w) for w in p.attrs.pad_width]
        if spatial is None or str(p.attrs.pad_mode) != "constant" or \
                float(p.attrs.pad_value) != 0.0 or len(width) != 2 * len(p.ty.shape):
            return expr
        before = [width[2 * a] for a in range(len(p.ty.shape))]
        after = [width[2 * a + 1] for a in range(len(p.ty.shape))]
        if any(before[a] or after[a] for a in range(len(before)) if a not in spatial) or \
                min(before + after) < 0:
            return expr
        own = [int(v) for v in c.attrs.padding]  # [begin of each spatial axis, end of each]
        k = len(spatial)
        padding = [own[i] + before[spatial[i]] for i in range(k)] + \
            [own[k + i] + after[spatial[i]] for i in range(k)]
        return make(matches[data], matches[weight], strides=c.attrs.strides, padding=padding,
                    dilation=c.attrs.dilation, groups=c.attrs.groups,
                    data_layout=c.attrs.data_layout, kernel_layout=c.attrs.kernel_layout,
                    out_layout=c.attrs.out_layout, out_dtype=c.attrs.out_dtype)

    return rewrite_call(conv, rewrite, func)


def _scalar(expr) -> Optional[float]:
    """A constant bound: an integer or float immediate (or a PrimValue holding one)."""
    while not isinstance(expr, (int, float)) and hasattr(expr, "value"):
        expr = expr.value
    return float(expr) if isinstance(expr, (int, float)) else None


def _clip_as_min_max(func: relax.Function) -> relax.Function:
    x, lo, hi = wildcard(), wildcard(), wildcard()
    clip = is_op("relax.clip")(x, lo, hi)

    def rewrite(expr, matches):
        bounds = [_scalar(matches[b]) for b in (lo, hi)]
        if None in bounds:
            return expr
        dtype = str(matches[x].ty.dtype)
        low, high = (relax.const(v, dtype) for v in bounds)
        return relax.op.minimum(relax.op.maximum(matches[x], low), high)

    return rewrite_call(clip, rewrite, func)


_SMALL_POWERS = (2.0, 3.0, 4.0)


def _small_power_as_products(func: relax.Function) -> relax.Function:
    x, exponent = wildcard(), is_const()
    power = is_op("relax.power")(x, exponent)

    def rewrite(expr, matches):
        e = _const(matches[exponent])
        if e is None or e.size != 1 or float(e.reshape(-1)[0]) not in _SMALL_POWERS:
            return expr
        n = int(e.reshape(-1)[0])
        base = matches[x]
        out = relax.op.multiply(base, base)
        if n == 4:
            return relax.op.multiply(out, out)
        return out if n == 2 else relax.op.multiply(out, base)

    return rewrite_call(power, rewrite, func)


def inference_pass() -> tvm.transform.Pass:
    """The rewrites above on every (non-primitive) Relax function of the module."""

    @tvm.transform.module_pass(opt_level=0, name="RollerInferenceRewrites")
    def _rewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = mod.clone()  # (assigning a function changes the module in place: the caller's)
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function) or \
                    (func.attrs is not None and func.attrs.get("Primitive")):
                continue
            func = _clip_as_min_max(_batch_norm_as_scale_shift(func))
            func = _small_power_as_products(func)
            for op_name in ("relax.nn.conv2d", "relax.nn.conv1d"):
                func = _pad_into_conv(func, op_name)
            mod[gv] = func
        return relax.transform.Normalize()(mod)

    return _rewrite
