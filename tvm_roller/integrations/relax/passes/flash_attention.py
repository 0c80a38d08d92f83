"""Relax: each attention ``softmax(Q·Kᵀ · scale + bias) · V`` of a CPU graph becomes one call of
roller's flash-attention kernel (``backends.cpu.flash_attention``): no score matrix in memory.

Found in a dataflow block as HF's eager attention imports: ``matmul(Q, permute_dims(K))``, then
optionally a multiply or divide by a scalar constant and an add of a bias (a mask), a softmax
over the last axis (an ``astype`` to float32 around it is no change for float32), and
``matmul(·, V)``, each intermediate used only by the next. Rank-3 operands (heads folded into
the batch) are viewed as rank 4; keys and values repeated over a group's query heads (HF's
``repeat_kv``, grouped-query attention; one head broadcast by the matmul, multi-query) are
read unrepeated, once per kv head. What does not fit (another dtype, a bias over the keys' axis
broadcast, different head sizes for K and V) is left to the matmul-chain fusion, with the
reason in ``chains``. Each kernel is a report entry with its tiles and roofline bound.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import tvm
import tvm.sym
from tvm import relax, tirx

from tvm_roller.backends.cpu.attention_plan import plan_tiles
from tvm_roller.backends.cpu.attention_work import attention_work
from tvm_roller.backends.cpu.flash_attention import AttentionShape, flash_attention_kernel
from tvm_roller.backends.registry import backend_for, has_backend
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware.model import DeviceModel
from tvm_roller.planner import FuncReport
from tvm_roller.planner.buckets import DEFAULT_UPPER
from tvm_roller.planner.roofline import counted_bound

logger = logging.getLogger("tvm_roller")

_OPS = {name: tvm.ir.Op.get(f"relax.{name}") for name in
        ("matmul", "permute_dims", "multiply", "divide", "add", "nn.softmax", "astype",
         "reshape", "broadcast_to", "expand_dims")}


@dataclass
class _Match:
    """One attention found: its operands (as bound in the block) and constants."""

    q: relax.Expr
    k: relax.Expr
    v: relax.Expr
    bias: Optional[relax.Expr]
    scale: float


def _call(defs: Dict[relax.Var, relax.Expr], expr, op: str) -> Optional[relax.Call]:
    value = defs.get(expr, expr) if isinstance(expr, relax.Var) else expr
    return value if isinstance(value, relax.Call) and value.op.same_as(_OPS[op]) else None


def _scalar(expr) -> Optional[float]:
    if isinstance(expr, tvm.ir.expr.GenericConst) and expr.value.numpy().size == 1:
        return float(expr.value.numpy().reshape(-1)[0])
    return None


def _dims(expr) -> Optional[List[object]]:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return list(ty.shape)


class _Finder:
    """Walks back from a ``matmul(P, V)`` binding through the pattern (see the module)."""

    def __init__(self, bindings) -> None:
        self.defs = {b.var: b.value for b in bindings}
        self.uses: Dict[relax.Var, int] = {}
        for b in bindings:
            for v in relax.analysis.free_vars(b.value):
                self.uses[v] = self.uses.get(v, 0) + 1

    def only_user(self, var) -> bool:
        return isinstance(var, relax.Var) and self.uses.get(var, 0) == 1 \
            and isinstance(var, relax.DataflowVar)

    def through(self, expr, inner: bool):
        """``expr`` before the views that only fold or split its batch dimensions (torch's
        matmul over rank 4 imports as reshapes to rank 3 around a batched matmul) and
        broadcasts to its own shape; ``inner``: an intermediate of the pattern (each view then
        must be the only use of what it views), not an operand (its views may stay)."""
        while isinstance(expr, relax.Var) and isinstance(self.defs.get(expr), relax.Call):
            call = self.defs[expr]
            view = call.op.same_as(_OPS["reshape"]) or call.op.same_as(_OPS["broadcast_to"])
            if not view or not _batch_view(call.args[0], expr, call.op.same_as(_OPS["reshape"])):
                break
            if inner and not self.only_user(expr):
                break
            expr = call.args[0]
        return expr

    def unrepeated(self, expr):
        """``expr`` before what repeats a kv head's keys or values for each query head of its
        group, since the kernel reads a group's kv head itself: HF's ``repeat_kv``
        (``expand_dims`` at axis 2, ``broadcast_to``, then the reshape ``through`` saw as a
        batch view), or one head broadcast over the heads (multi-query attention left to the
        matmul's broadcast); else ``expr``."""
        wide = _call(self.defs, expr, "broadcast_to")
        if wide is None:
            return expr
        src, dims = wide.args[0], _dims(expr)
        a = _dims(src)
        if a is not None and dims is not None and len(a) == len(dims) == 4 \
                and _int(a[1]) == 1 and all(_same(a[i], dims[i]) for i in (0, 2, 3)):
            return src
        unit = _call(self.defs, src, "expand_dims")
        if unit is None or [int(x) for x in unit.attrs.axis] != [2]:
            return expr
        src = unit.args[0]
        a = _dims(src)
        if a is None or dims is None or len(a) != 4 or len(dims) != 5 \
                or not all(_same(x, y) for x, y in zip(a, dims[:2] + dims[3:])):
            return expr
        return src

    def match(self, value: relax.Call) -> Optional[_Match]:
        p, v = value.args
        p = self.through(p, True)
        while (cast := _call(self.defs, p, "astype")) is not None and self.only_user(p):
            p = self.through(cast.args[0], True)
        soft = _call(self.defs, p, "nn.softmax")
        if soft is None or not self.only_user(p) or int(soft.attrs.axis) not in (-1, len(
                _dims(p) or []) - 1):
            return None
        x, bias, scale = self.through(soft.args[0], True), None, 1.0
        add = _call(self.defs, x, "add")
        if add is not None and self.only_user(x):
            x, bias = self.through(add.args[0], True), add.args[1]
            if not any(_call(self.defs, x, op) is not None
                       for op in ("matmul", "multiply", "divide")):
                x, bias = self.through(add.args[1], True), add.args[0]
        for op in ("multiply", "divide"):
            call = _call(self.defs, x, op)
            if call is not None and self.only_user(x):
                c = _scalar(call.args[1]) if op == "divide" else \
                    (_scalar(call.args[1]) if _scalar(call.args[1]) is not None
                     else _scalar(call.args[0]))
                if c is None or (op == "divide" and c == 0.0):
                    return None
                x = self.through(call.args[0] if _scalar(call.args[0]) is None
                                 else call.args[1], True)
                scale = 1.0 / c if op == "divide" else c
                break
        mm = _call(self.defs, x, "matmul")
        if mm is None or not self.only_user(x):
            return None
        q, kt = self.through(mm.args[0], False), self.unrepeated(self.through(mm.args[1], False))
        perm = _call(self.defs, kt, "permute_dims")
        rank = len(_dims(kt) or [])
        if perm is None or rank < 3 or perm.attrs.axes is None or [int(a) for a in perm.attrs.axes] \
                != list(range(rank - 2)) + [rank - 1, rank - 2]:
            return None
        k, v = (self.unrepeated(self.through(e, False)) for e in (perm.args[0], v))
        return _Match(q, k, v, bias, scale)


def _batch_view(src, dst, reshape: bool) -> bool:
    """``dst`` is ``src`` with its leading (batch) dimensions folded or split (a reshape), or
    ``src`` itself (a broadcast to its own shape)."""
    a, b = _dims(src), _dims(dst)
    if a is None or b is None:
        return False
    if not reshape:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if len(a) < 3 or len(b) < 3 or not (_same(a[-1], b[-1]) and _same(a[-2], b[-2])):
        return False
    lead_a, lead_b = [_int(d) for d in a[:-2]], [_int(d) for d in b[:-2]]
    return None not in lead_a + lead_b and math.prod(lead_a) == math.prod(lead_b)


def attention_shape(m: _Match) -> AttentionShape:
    """The kernel's shape for a match (UnsupportedError, with the reason, when the kernel cannot
    take it)."""
    q, k, v = _dims(m.q), _dims(m.k), _dims(m.v)
    if q is None or k is None or v is None or not len(q) == len(k) == len(v) \
            or len(q) not in (3, 4):
        raise UnsupportedError("attention operands of rank 3 or 4 with known shapes")
    dtypes = {str(e.ty.dtype) for e in (m.q, m.k, m.v)}
    if dtypes != {"float32"}:
        raise UnsupportedError(f"flash attention is float32; the operands are {sorted(dtypes)}")
    q, k, v = ([1] * (4 - len(q)) + x for x in (q, k, v))
    batch, heads, hd, kv_heads = (_int(e) for e in (q[0], q[1], q[3], k[1]))
    if None in (batch, heads, hd, kv_heads) or _int(k[0]) != batch or _int(v[0]) != batch \
            or _int(v[1]) != kv_heads or _int(k[3]) != hd or _int(v[3]) != hd \
            or not _same(k[2], v[2]):
        raise UnsupportedError(f"q {q}, k {k}, v {v}: static batch and heads, one head size")
    return AttentionShape(batch, heads, kv_heads, hd,
                          None if m.bias is None else _bias(m.bias, q, k))


def _bias(bias, q, k) -> Tuple[int, int, bool]:
    b = _dims(bias)
    if b is None or len(b) > 4 or str(bias.ty.dtype) != "float32":
        raise UnsupportedError("the bias: float32, rank <= 4, a known shape")
    b = [1] * (4 - len(b)) + b
    if not _same(b[3], k[2]):
        raise UnsupportedError(f"a bias {b} broadcast along the keys {k[2]}")
    rows = _int(b[2]) != 1
    if _int(b[0]) not in (1, _int(q[0])) or _int(b[1]) not in (1, _int(q[1])) \
            or (rows and not _same(b[2], q[2])):
        raise UnsupportedError(f"a bias {b} that does not broadcast over the scores")
    return _int(b[0]), _int(b[1]), rows


def _int(e) -> Optional[int]:
    return int(e) if isinstance(e, (int, tirx.IntImm)) else None


def _same(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(tvm.sym.Analyzer().can_prove_equal(a, b))


@relax.expr_functor.mutator
class _Rewriter(relax.expr_functor.PyExprMutator):
    """Each matched attention's last matmul bound to the kernel's call (the rest is dead)."""

    def __init__(self, mod: tvm.IRModule, dev: DeviceModel, report: Optional[list],
                 decisions: Optional[list]) -> None:
        super().__init__(mod)
        self.dev, self.report, self.decisions = dev, report, decisions
        self.finder: Optional[_Finder] = None
        self.bounds: Dict[str, int] = {}  # the function's symbolic lengths' upper bounds
        self.count = 0
        self.recorded: set = set()

    def visit_dataflow_block_(self, block):  # noqa: N802 (TVM's visitor name)
        self.finder = _Finder(block.bindings)
        try:
            return super().visit_dataflow_block_(block)
        finally:
            self.finder = None

    def visit_var_binding_(self, binding):  # noqa: N802
        value = binding.value
        found = self.finder is not None and isinstance(value, relax.Call) \
            and value.op.same_as(_OPS["matmul"]) and self.finder.match(value)
        if not found:
            return super().visit_var_binding_(binding)
        try:
            shape = attention_shape(found)
        except UnsupportedError as err:
            self._decide(found, False, f"flash attention declined: {err}")
            return super().visit_var_binding_(binding)
        self._decide(found, True, "flash attention kernel")
        out = self._emit(found, shape, binding.var)
        if isinstance(binding.var, relax.DataflowVar):
            var = self.builder_.emit(out, name_hint=binding.var.name)
        else:  # the block's output: used after it
            var = self.builder_.emit_output(out, name_hint=binding.var.name)
        self.set_var_remap(binding.var, var)

    def _emit(self, m: _Match, shape: AttentionShape, var) -> relax.Expr:
        """The kernel's call on the operands viewed as rank 4 (its result viewed back)."""
        q_len, kv_len = (self._length(d) for d in (_dims(m.q)[-2], _dims(m.k)[-2]))
        tiles = plan_tiles(self.dev, shape.head_dim, kv_len, shape.heads // shape.kv_heads)
        args = [self._as4(e) for e in (m.q, m.k, m.v) + ((m.bias,) if m.bias is not None
                                                          else ())]
        if isinstance(_dims(m.k)[-2], tirx.IntImm):
            # the keys transposed and padded to whole blocks once, for every query tile
            args[1] = self._keys_transposed(args[1], kv_len, tiles.block)
            shape = dataclasses.replace(shape, keys_transposed=True)
        func = flash_attention_kernel(shape, m.scale, tiles)
        gv = self.builder_.add_func(func, f"flash_attention{self.count}")
        self.count += 1
        call = relax.call_tir(gv, args, relax.TensorType(_dims(args[0]), "float32"))
        # (the builder gives an equal kernel, another layer's, its first name: one entry)
        if self.report is not None and gv.name_hint not in self.recorded:
            self.recorded.add(gv.name_hint)
            bias = 0 if shape.bias is None else \
                shape.bias[0] * shape.bias[1] * (q_len if shape.bias[2] else 1) * kv_len * 4
            work = attention_work(shape.heads, shape.kv_heads, shape.head_dim, q_len, kv_len,
                                  causal=shape.causal, batch=shape.batch, other_bytes=bias)
            b = counted_bound(*work, self.dev)
            self.report.append(FuncReport(gv.name_hint, "roller", kind="flash-attention",
                                          rtile=tiles.to_dict(), bound_s=b.seconds,
                                          bound_by=f"{b.by} ({q_len} x {kv_len})").to_dict())
        if len(_dims(var)) == 4:
            return call
        return relax.op.reshape(self.builder_.emit(call), _dims(var))

    def _keys_transposed(self, keys, length: int, block: int) -> relax.Expr:
        kt = self.builder_.emit(relax.op.permute_dims(keys, [0, 1, 3, 2]))
        pad = -(-length // block) * block - length
        if not pad:
            return kt
        return self.builder_.emit(relax.op.nn.pad(kt, [0, 0] * 3 + [0, pad]))

    def _as4(self, expr) -> relax.Expr:
        new = self.visit_expr(expr)
        dims = _dims(new)
        if len(dims) == 4:
            return new
        return self.builder_.emit(relax.op.reshape(new, [1] * (4 - len(dims)) + dims))

    def _length(self, dim) -> int:
        """A static length, or a symbolic one's upper bound (the largest default bucket when
        the function gives none)."""
        if isinstance(dim, tirx.IntImm):
            return int(dim)
        return int(self.bounds.get(getattr(dim, "name", ""), DEFAULT_UPPER))

    def _decide(self, m: _Match, fused: bool, reason: str) -> None:
        label = f"attention {[str(d) for d in _dims(m.q) or []]}"
        logger.info("tvm_roller: %s: %s", label, reason)
        if self.decisions is not None:
            self.decisions.append({"chain": label, "fused": fused, "reason": reason})


def flash_attention_pass(device: Optional[DeviceModel] = None, report: Optional[list] = None,
                         decisions: Optional[list] = None) -> tvm.transform.Pass:
    """The module's attentions as flash-attention kernels on a CPU target (see the module);
    ``report`` gets an entry per kernel, ``decisions`` one per attention found."""

    @tvm.transform.module_pass(opt_level=0, name="RollerFlashAttention")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        tgt = tvm.target.Target.current(allow_none=True)
        if tgt is None or not has_backend(tgt) or not backend_for(tgt).flash_attention:
            return mod
        dev = device if device is not None else backend_for(tgt).device_model(tgt)
        rewriter = _Rewriter(mod, dev, report, decisions)
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function) and not (func.attrs is not None
                                                         and func.attrs.get("Primitive")):
                bounds = (func.attrs or {}).get("tir_var_upper_bound") or {}
                rewriter.bounds = {str(k): int(v) for k, v in bounds.items()}
                new = rewriter.visit_expr(func)
                rewriter.builder_.update_func(gv, relax.analysis.remove_all_unused(new))
        return relax.transform.Normalize()(rewriter.builder_.get())

    return _pass
