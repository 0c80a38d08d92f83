"""bf16 matmuls accumulate in float32.

A bf16 model (``model.to(torch.bfloat16)``) exports its linear layers as ``matmul`` of bf16
operands with a bf16 result, which TVM legalizes as a sum *in bf16*: every partial sum rounded
to 8 bits of mantissa (and no product a hardware tile instruction takes: AMX and
``vdpbf16ps`` accumulate in float32). ``matmul(a, b)`` becomes ``astype(matmul(a, b,
out_dtype=float32), bfloat16)``: the products summed in float32 and rounded once (what PyTorch's
oneDNN kernels do), and the cast is an elementwise epilogue FuseOps joins to the matmul.

Normalizations, softmax and activations of bf16 tensors are computed in float32 the same way (their
operands cast up, the result cast back: prologue and epilogue of one fused kernel): TVM's
legalization has no bf16 layer norm, and a bf16 running sum of a row loses the row's tail.
"""
from __future__ import annotations

import tvm
from tvm import relax

from tvm_roller.integrations.relax.passes.mutate import mutate_functions

_LOW = ("bfloat16",)
#: computed in float32 (every bf16 tensor operand cast up, the result back): row reductions,
#: and the activations whose float32 forms are vector polynomials (``fast_math``; in bf16
#: TVM calls scalar libm per element: GELU's erf made BERT's FFN kernel 4× slower)
_IN_F32 = ("relax.nn.layer_norm", "relax.nn.group_norm", "relax.nn.rms_norm",
           "relax.nn.softmax", "relax.nn.log_softmax", "relax.nn.batch_norm",
           "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.sigmoid",
           "relax.tanh", "relax.exp", "relax.erf")


def _dtype(expr) -> str:
    return str(getattr(getattr(expr, "ty", None), "dtype", ""))


@relax.expr_functor.mutator
class _Widen(relax.expr_functor.PyExprMutator):
    def visit_call_(self, call):  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.name in _IN_F32 and _dtype(call) in _LOW:
            low = _dtype(call)
            args = [relax.op.astype(a, "float32") if _dtype(a) == low else a for a in call.args]
            return relax.op.astype(relax.Call(call.op, args, call.attrs), low)
        if call.op.name != "relax.matmul":
            return call
        low = _dtype(call)
        if low not in _LOW or any(_dtype(a) != low for a in call.args):
            return call
        wide = relax.op.matmul(call.args[0], call.args[1], out_dtype="float32")
        return relax.op.astype(wide, low)


def accumulate_f32_pass() -> tvm.transform.Pass:
    """The rewrite above on every Relax function."""

    @tvm.transform.module_pass(opt_level=0, name="RollerAccumulateF32")
    def _rewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_functions(mod, _Widen())

    return _rewrite
