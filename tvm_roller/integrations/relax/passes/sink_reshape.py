"""Elementwise work moved before the reshapes around it, so it fuses into its producer.

PyTorch's ``nn.Linear`` on a 3-D activation exports as ``reshape → matmul + bias → reshape``,
and the activation that follows (GELU, SiLU, GPT-2's tanh GELU written as a dozen scalar ops)
reads the reshaped tensor. TVM's FuseOps joins elementwise ops to a matmul's epilogue but not a
reshape, so the activation ran as a kernel of its own: one more pass over the activations
(ONNX Runtime fuses the same pattern, as BiasGelu / FastGelu). An elementwise op of reshaped
operands is the reshape of the op of the unreshaped ones when every tensor operand is reshaped
from the same shape to the same shape. Scalars ride along; so does a tensor of the result's shape
(a residual), reshaped back, when the reshape raised the rank; and so does an operand that varies
along the last axis only (a bias, a batch norm's scale per channel) when the reshape keeps that
axis. Casts sink too. A convolution computed as a GEMM (``conv_gemm``) ends in such a reshape, so
its batch norm, residual and activation join the GEMM's kernel. Consecutive reshapes collapse
into one and a reshape to the tensor's own shape goes. Values do not change.
"""
from __future__ import annotations

from typing import Optional

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

# Elementwise ops (shape in = shape out) whose value at an element depends only on the
# operands' values at that element.
_UNARY = ("relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.nn.relu",
          "relax.sigmoid", "relax.tanh", "relax.exp", "relax.erf", "relax.negative",
          "relax.sqrt", "relax.rsqrt", "relax.square", "relax.abs", "relax.astype")
_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum",
           "relax.minimum", "relax.power")
#: rewriting rounds at most (each sinks every op one reshape further)
_ROUNDS = 32


def _shape(expr) -> Optional[tuple]:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    if shape is None:
        return None
    dims = tuple(getattr(d, "value", d) for d in shape)
    return dims if all(isinstance(d, int) for d in dims) else None


def _operand_on_source(expr, source: tuple, target: tuple):
    """``expr`` (an operand broadcast against ``target``) as an operand of the same op on
    ``source``: a scalar as it is, a tensor of ``target``'s shape reshaped to ``source``, one
    that varies along the last axis only (when the reshape keeps that axis) reshaped to
    ``source``'s rank; else None."""
    shape = _shape(expr)
    if shape is None:
        return None
    if shape == ():
        return expr
    if shape == target:  # a whole tensor (a residual): its reshape is a view; only towards
        # the lower rank (a GEMM's 2-D result), else two operands would trade places forever
        return relax.op.reshape(expr, list(source)) if len(source) < len(target) else None
    leading = shape[:-1]
    if any(d != 1 for d in leading) or len(shape) > len(target) or not source or \
            source[-1] != target[-1] or shape[-1] not in (1, target[-1]):
        return None
    return relax.op.reshape(expr, [1] * (len(source) - 1) + [shape[-1]]) \
        if len(shape) > 1 else expr


def _sink(func: relax.Function) -> relax.Function:
    """One round: ``op(reshape(a), ...)`` -> ``reshape(op(a, ...))`` (see the module doc)."""
    for name in _UNARY + _BINARY:
        nargs = 1 if name in _UNARY else 2
        for shaped in ([(0,)] if nargs == 1 else [(0, 1), (0,), (1,)]):
            func = _sink_one(func, name, nargs, shaped)
    return func


def _sink_one(func: relax.Function, name: str, nargs: int, shaped: tuple) -> relax.Function:
    """``name`` applied to reshapes at the positions ``shaped`` and scalars elsewhere."""
    reshapes = {i: is_op("relax.reshape")(wildcard(), wildcard()) for i in shaped}
    others = {i: wildcard() for i in range(nargs) if i not in shaped}
    pattern = is_op(name)(*[reshapes.get(i, others.get(i)) for i in range(nargs)])

    def rewrite(expr, matches):
        calls = [matches[reshapes[i]] for i in shaped]
        sources = {_shape(c.args[0]) for c in calls}
        targets = {_shape(c) for c in calls}
        if None in sources or len(sources) != 1 or len(targets) != 1:
            return expr
        source, target = sources.pop(), targets.pop()
        moved_others = {i: _operand_on_source(matches[others[i]], source, target) for i in others}
        if any(v is None for v in moved_others.values()):
            return expr
        inner = [matches[reshapes[i]].args[0] if i in reshapes else moved_others[i]
                 for i in range(nargs)]
        moved = relax.Call(expr.op, inner, expr.attrs, expr.ty_args)
        return relax.op.reshape(moved, calls[0].args[1])

    return rewrite_call(pattern, rewrite, func)


def _collapse(func: relax.Function) -> relax.Function:
    """``reshape(reshape(a, s1), s2)`` -> ``reshape(a, s2)``; ``reshape(a, shape(a))`` -> a."""
    inner = is_op("relax.reshape")(wildcard(), wildcard())
    twice = is_op("relax.reshape")(inner, wildcard())
    func = rewrite_call(twice, lambda expr, m: relax.op.reshape(m[inner].args[0], expr.args[1]),
                        func)
    src = wildcard()
    once = is_op("relax.reshape")(src, wildcard())

    def identity(expr, matches):
        same = _shape(matches[src]) is not None and _shape(matches[src]) == _shape(expr)
        return matches[src] if same else expr

    return rewrite_call(once, identity, func)


def sink_reshape_pass() -> tvm.transform.Pass:
    """The rewrites above on every (non-primitive) Relax function, to a fixed point."""

    @tvm.transform.module_pass(opt_level=0, name="RollerSinkReshape")
    def _rewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = mod.clone()
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function) or \
                    (func.attrs is not None and func.attrs.get("Primitive")):
                continue
            for _ in range(_ROUNDS):
                new = _collapse(_sink(func))
                if tvm_ffi.structural_equal(new, func):
                    break
                func = new
            mod[gv] = func
        return mod

    return _rewrite
