"""Weight-only quantization of a Relax function's linear layers (``weights="int8" | "int4"``).

A weight ``w [n, k]`` — a parameter (an LLM's weights, passed at run time) or a constant (a
model imported with its weights) — is quantized when every use of it is a linear layer
(``matmul(x, permute_dims(w))``, or ``matmul(x, c)`` with a constant ``c [k, n]``) or an
embedding lookup (``take(w, ids, axis=0)``). Each linear layer becomes two of roller's kernels
(``backends.cpu.quant_linear``): the activations quantized in groups, then the integer
matmul over the packed weight, built from the target's dot-product route
(``backends.cpu.microkernel.quant_dot``: ``check_target`` picks it); a lookup dequantizes its
rows. A parameter ``w`` becomes two (its packed words and its scales, in its place); a
constant becomes two constants.

A parameter of stacked experts ``[experts, n, k]`` read only by routed products
(``analysis.routed``: a mixture-of-experts layer's ``rows @ w[expert].T``) is packed expert by
expert; each product becomes the same two kernels over views of its expert's words and scales
(no copy: the run-time expert picks the offset), so an unrouted expert is never read.

A weight whose shape the format cannot take, or that something else reads, stays float32 with
its reason (``QuantDecision``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.expr import Constant
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from tvm_roller.analysis.routed import RoutedCall, routed_call
from tvm_roller.backends.cpu.kv_cache import mark_scheduled
from tvm_roller.backends.cpu.microkernel.quant_dot import QuantDotRoute, pick_quant_route
from tvm_roller.backends.cpu.quant_format import GROUP, ROWS, QuantFormat, get_format, \
    quantize_packed, shape_reason
from tvm_roller.backends.cpu.quant_linear import gather_rows_kernel, matmul_kernel, \
    quantize_rows_kernel
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.planner import FuncReport


@dataclass(frozen=True)
class QuantDecision:
    """One weight: quantized (``reason`` None) or kept float32, and why."""

    name: str
    shape: Tuple[int, ...]
    format: str
    reason: Optional[str] = None
    unused: bool = False  # read by nothing (a tied table's second name): dropped


    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TargetFormat(QuantFormat):
    """A format as one target multiplies it: the packed layout (target-independent) and the
    dot-product route its kernels are built from (``check_target``'s answer; it travels where
    a ``QuantFormat`` does, so the rewrite's kernels are the target's)."""

    route: Optional[QuantDotRoute] = None


def _route_of(fmt: QuantFormat) -> QuantDotRoute:
    route = getattr(fmt, "route", None)
    if route is None:
        raise ValueError(f"format {fmt.name!r} has no dot-product route: make it with "
                         f"check_target(target, {fmt.name!r})")
    return route


@dataclass(frozen=True)
class _Packed:
    """A quantized weight ``w [n, k]`` as the rewritten function reads it; ``transposed``: a
    constant held as ``[k, n]`` (read by ``matmul(x, c)``, not through a ``permute_dims``)."""

    words: relax.Expr
    scales: relax.Expr
    n: int
    k: int
    transposed: bool = False
    experts: int = 0  # stacked experts ``[experts, n, k]``, each read by routed products


_LINEAR, _GATHER, _ROUTED, _OTHER = "linear", "gather", "routed", "other"


def _operands(call: relax.Call):
    """``(position, argument)`` of a call, a tuple's fields (a ``call_tir``'s) at position -1."""
    for i, arg in enumerate(call.args):
        if isinstance(arg, relax.Tuple):
            yield from ((-1, f) for f in arg.fields)
        else:
            yield i, arg


def _quantizable_routed(expr, mod: Optional[tvm.IRModule]) -> Optional[RoutedCall]:
    """``expr`` as a routed product the kernels take (float32 rows by a parameter of experts
    stored ``[experts, n, k]``), or None."""
    routed = routed_call(expr, mod) if mod is not None else None
    if routed is None or not routed.transposed or not isinstance(routed.stored, relax.Var):
        return None
    if str(routed.rows.ty.dtype) != "float32" or str(expr.ty.dtype) != "float32":
        return None
    return routed


def _uses(func: relax.Function, mod: Optional[tvm.IRModule] = None) -> Dict[relax.Var, set]:
    """How each variable is read: ``linear`` (as ``permute_dims(v)`` feeding only matmuls'
    second operand), ``gather`` (``take(v, ids, axis=0)``), ``routed`` (the stacked experts
    of a routed product in ``mod``), ``other``."""
    uses: Dict[relax.Var, set] = {}
    transposes: Dict[relax.Var, relax.Var] = {}
    bindings = [b for block in func.body.blocks for b in block.bindings]
    for b in bindings:
        v = b.value
        if is_transpose(v) and isinstance(v.args[0], relax.Var):
            transposes[b.var] = v.args[0]
    for b in bindings:
        v = b.value
        if b.var in transposes:
            continue  # the transpose itself: its own uses say what the weight is
        name = getattr(v.op, "name", "") if isinstance(v, relax.Call) else ""
        routed = _quantizable_routed(v, mod)
        if routed is not None:
            uses.setdefault(routed.stored, set()).add(_ROUTED)
        for i, arg in (_operands(v) if isinstance(v, relax.Call) else ()):
            if not isinstance(arg, relax.Var) or (routed is not None and arg.same_as(
                    routed.stored)):
                continue
            if arg in transposes and name == "relax.matmul" and i == 1 and float_rows(v):
                uses.setdefault(transposes[arg], set()).add(_LINEAR)
            elif name == "relax.take" and i == 0 and int(v.attrs.axis or 0) == 0:
                uses.setdefault(arg, set()).add(_GATHER)
            else:
                uses.setdefault(transposes.get(arg, arg), set()).add(_OTHER)
        if not isinstance(v, relax.Call):
            for arg in relax.analysis.free_vars(v):
                uses.setdefault(transposes.get(arg, arg), set()).add(_OTHER)
    for arg in relax.analysis.free_vars(func.body.body):
        uses.setdefault(transposes.get(arg, arg), set()).add(_OTHER)
    return uses


def is_transpose(expr) -> bool:
    """``permute_dims`` of a matrix that swaps its axes."""
    if not (isinstance(expr, relax.Call) and getattr(expr.op, "name", "") ==
            "relax.permute_dims") or len(expr.args[0].ty.shape or ()) != 2:
        return False
    axes = expr.attrs.axes
    return axes is None or [int(a) for a in axes] == [1, 0]


def float_rows(matmul: relax.Call) -> bool:
    """A matmul whose first operand the kernels take: float32 rows (``[..., k]``)."""
    x = matmul.args[0]
    return str(x.ty.dtype) == "float32" and len(x.ty.shape or ()) >= 1 and \
        str(matmul.ty.dtype) == "float32"


def param_decisions(func: relax.Function, fmt: QuantFormat, names: Sequence[str],
                    mod: Optional[tvm.IRModule] = None) -> List[QuantDecision]:
    """One decision per parameter named in ``names`` (the function's trailing parameters, in
    order: an LLM's weights); ``mod`` holds the kernels the function calls (to find its
    routed products)."""
    uses = _uses(relax.analysis.remove_all_unused(func), mod)
    params = list(func.params)[len(func.params) - len(names):]
    out = []
    for name, p in zip(names, params):
        shape = tuple(int(d) for d in p.ty.shape) if p.ty.shape is not None else ()
        kinds = uses.get(p, set())
        if not kinds:
            out.append(QuantDecision(name, shape, fmt.name, "unused", unused=True))
            continue
        out.append(QuantDecision(name, shape, fmt.name, _reason(fmt, shape, str(p.ty.dtype),
                                                                 kinds)))
    return out


def _reason(fmt: QuantFormat, shape: Tuple[int, ...], dtype: str, kinds: set) -> Optional[str]:
    """Why a weight read as ``kinds`` stays float32 (None: it is quantized)."""
    if dtype != "float32":
        return "not a float32 weight"
    if len(shape) == 3:
        if kinds != {_ROUTED}:
            return ("a 3-D weight read other than by routed products over experts stored "
                    "[experts, n, k] (a filter; experts read as [experts, k, n]): kept float32")
        return shape_reason(fmt, *shape[1:])
    if len(shape) != 2:
        return "not a float32 matrix read by a linear layer"
    if _OTHER in kinds or _ROUTED in kinds:
        return "also read by other than a linear layer or an embedding lookup"
    return shape_reason(fmt, *shape)


class _Kernels:
    """The kernels the rewritten functions call, added once each to the module being built
    (``builder``: a BlockBuilder over it, which gives their GlobalVars the callee type
    ``call_tir`` checks); ``fmt`` a ``TargetFormat`` (the kernels are its route's)."""

    def __init__(self, fmt: QuantFormat, builder: relax.BlockBuilder, report: Optional[list],
                 prefix: str = ""):
        self.fmt, self.builder, self.report, self.prefix = fmt, builder, report, prefix
        self.route = _route_of(fmt)
        self.gvars: Dict[str, tvm.ir.GlobalVar] = {}

    def get(self, kind: str, n: int, k: int) -> tvm.ir.GlobalVar:
        name = f"{self.prefix}quant_{kind}_{self.fmt.name}_{n}x{k}" \
            if kind != "quantize_rows" else f"{self.prefix}quant_rows_{self.fmt.name}_{k}"
        if name not in self.gvars:
            make = {"matmul": lambda: matmul_kernel(self.fmt, n, k, self.route),
                    "gather": lambda: gather_rows_kernel(self.fmt, n, k),
                    "quantize_rows": lambda: quantize_rows_kernel(self.fmt, k, self.route)}[kind]
            self.gvars[name] = self.builder.add_func(mark_scheduled(make()), name)
            if self.report is not None:
                self.report.append(FuncReport(name, "roller", kind="quant-linear").to_dict())
        return self.gvars[name]


def _product(dims) -> tirx.PrimExpr:
    """The number of rows ``dims`` make (symbolic where a dimension is)."""
    m = tirx.IntImm("int64", 1)
    for d in dims:
        m = m * d
    return tvm.sym.Analyzer().simplify(m)


def _linear(x: relax.Expr, w: _Packed, kernels: _Kernels) -> relax.Expr:
    """``x [..., k] @ w.T`` over the packed ``w [n, k]``."""
    n, k = w.n, w.k
    lead = list(x.ty.shape)[:-1]
    m = _product(lead)
    flat = relax.op.reshape(x, relax.ShapeExpr([m, k]))
    q = relax.call_tir(kernels.get("quantize_rows", n, k), [flat], [
        relax.TensorType([m, k], "int8"),
        relax.TensorType([m, k // GROUP], "float32"),
        relax.TensorType([m, k // GROUP], "int32")])
    y = relax.call_tir(kernels.get("matmul", n, k),
                       [relax.TupleGetItem(q, 0), relax.TupleGetItem(q, 1),
                        relax.TupleGetItem(q, 2), w.words, w.scales],
                       relax.TensorType([m, n], "float32"))
    return relax.op.reshape(y, relax.ShapeExpr(lead + [n]))


def _gather(ids: relax.Expr, w: _Packed, kernels: _Kernels) -> relax.Expr:
    """``take(w, ids, axis=0)`` over the packed ``w [n, k]``."""
    n, k = w.n, w.k
    lead = list(ids.ty.shape)
    m = _product(lead)
    flat = relax.op.reshape(relax.op.astype(ids, "int64"), relax.ShapeExpr([m]))
    rows = relax.call_tir(kernels.get("gather", n, k), [flat, w.words, w.scales],
                          relax.TensorType([m, k], "float32"))
    return relax.op.reshape(rows, relax.ShapeExpr(lead + [k]))


def packed_types(fmt: QuantFormat, n: int, k: int,
                 experts: int = 0) -> Tuple[relax.TensorType, ...]:
    """The words' and scales' types of a ``[n, k]`` weight (``experts`` of them stacked)."""
    g = k // GROUP
    lead = [experts] if experts else []
    return (relax.TensorType(lead + [n // ROWS, g, fmt.chunks, ROWS], "int32"),
            relax.TensorType(lead + [n // ROWS, g, ROWS], "float32"))


def _expert_view(fmt: QuantFormat, w: _Packed, expert: tirx.PrimExpr) -> _Packed:
    """Expert ``expert`` of the stacked ``w``: views of its words and scales (no copy; the
    kernels take a buffer offset)."""
    one = packed_types(fmt, w.n, w.k)

    def view(whole, ty):
        size = 4 * int(np.prod([int(d) for d in ty.shape]))
        offset = expert.astype("int64") * tirx.IntImm("int64", size)
        return relax.op.memory.view(whole, ty.shape, ty.dtype, relax.prim_value(offset))

    return _Packed(view(w.words, one[0]), view(w.scales, one[1]), w.n, w.k)


def quantize_params(mod: tvm.IRModule, name: str, decisions: Sequence[QuantDecision],
                    fmt: QuantFormat, report: Optional[list] = None,
                    prefix: str = "") -> tvm.IRModule:
    """``mod`` with function ``name``'s trailing parameters (one per decision) that are to be
    quantized replaced by their packed words and scales (in their place), unused ones dropped,
    and its linear layers and lookups over them rewritten onto the kernels (named
    ``prefix``...)."""
    gv = mod.get_global_var(name)
    # (a dead binding would read a replaced parameter: the importer leaves the transposes of
    # stacked experts its routed products read in place)
    func = relax.analysis.remove_all_unused(mod[gv])
    params = list(func.params)
    first = len(params) - len(decisions)
    packed: Dict[relax.Var, _Packed] = {}
    new_params = params[:first]
    for d, p in zip(decisions, params[first:]):
        if d.unused:
            continue
        if d.reason is not None:
            new_params.append(p)
            continue
        experts, (n, k) = (d.shape[0] if len(d.shape) == 3 else 0), d.shape[-2:]
        ws, ss = packed_types(fmt, n, k, experts)
        wv, sv = relax.Var(f"{p.name}_q", ws), relax.Var(f"{p.name}_s", ss)
        packed[p] = _Packed(wv, sv, n, k, experts=experts)
        new_params += [wv, sv]
    if len(new_params) == len(params) and not packed:
        return mod
    builder = relax.BlockBuilder(mod)
    kernels = _Kernels(fmt, builder, report, prefix)
    body = _rewrite(func, lambda w: packed.get(w) if isinstance(w, relax.Var) else None,
                    kernels, mod).body
    builder.update_func(gv, relax.Function(new_params, body, func.ret_ty,
                                           func.is_pure, func.attrs))
    return _share_quantized_activations(builder.get())


def _share_quantized_activations(mod: tvm.IRModule) -> tvm.IRModule:
    """One quantization of an activation for all the linear layers reading it (q / k / v,
    gate / up): the rewrite emits one per layer, identical calls that this merges."""
    return relax.transform.EliminateCommonSubexpr()(mod)


def _rewrite(func: relax.Function, lookup: Callable, kernels: _Kernels,
             mod: Optional[tvm.IRModule] = None) -> relax.Function:
    """Linear layers, lookups and routed products (kernels in ``mod``) over a weight ``lookup``
    knows (-> its ``_Packed``) rewritten onto the kernels."""
    x, w, ids = wildcard(), wildcard(), wildcard()
    transpose = is_op("relax.permute_dims")(w)
    linear = is_op("relax.matmul")(x, transpose)
    plain = is_op("relax.matmul")(x, w)
    gather = is_op("relax.take")(w, ids)

    def on_linear(expr, matches):
        found = lookup(matches[w])
        if found is None or found.transposed or not is_transpose(matches[transpose]) \
                or not float_rows(expr):
            return expr
        return _linear(matches[x], found, kernels)

    def on_plain(expr, matches):
        found = lookup(matches[w])
        if found is None or not found.transposed or not float_rows(expr):
            return expr
        return _linear(matches[x], found, kernels)

    def on_gather(expr, matches):
        found = lookup(matches[w])
        if found is None or found.transposed or int(expr.attrs.axis or 0) != 0:
            return expr
        return _gather(matches[ids], found, kernels)

    def on_routed(expr, matches):
        routed = _quantizable_routed(expr, mod)
        found = lookup(routed.stored) if routed is not None else None
        if found is None or not found.experts:
            return expr
        return _linear(routed.rows, _expert_view(kernels.fmt, found, routed.expert), kernels)

    func = rewrite_call(linear, on_linear, func)
    func = rewrite_call(gather, on_gather, func)
    func = rewrite_call(is_op("relax.call_tir")(wildcard(), wildcard()), on_routed, func)
    return rewrite_call(plain, on_plain, func)


def quantize_constants(mod: tvm.IRModule, fmt: QuantFormat,
                       decisions: Optional[list] = None,
                       report: Optional[list] = None) -> tvm.IRModule:
    """Every Relax function's constant linear weights quantized (see the module's docstring);
    ``decisions`` gets one :class:`QuantDecision` per constant matrix a matmul reads."""
    builder = relax.BlockBuilder(mod)
    kernels = _Kernels(fmt, builder, report)
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        consts = _constant_weights(func, fmt, decisions)
        if consts:
            builder.update_func(gv, _rewrite(
                func, lambda c: consts.get(c) if isinstance(c, Constant) else None, kernels))
    return _share_quantized_activations(builder.get())


def _constant_weights(func: relax.Function, fmt: QuantFormat,
                      decisions: Optional[list]) -> Dict[Constant, _Packed]:
    """The constant matrices matmuls read as their second operand (``w [n, k]`` transposed
    in a ``permute_dims``, or ``c [k, n]`` itself), packed; keyed by the constant node."""
    found: Dict[Constant, _Packed] = {}
    seen: set = set()
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}

    def value(expr):
        return bound.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def visit(expr):
        if not (isinstance(expr, relax.Call) and getattr(expr.op, "name", "") ==
                "relax.matmul") or not float_rows(expr):
            return
        b = value(expr.args[1])
        transposed = isinstance(b, Constant)
        if not transposed and is_transpose(b):
            b = value(b.args[0])
        if not isinstance(b, Constant) or len(b.ty.shape) != 2 or b in seen:
            return
        seen.add(b)
        array = b.value.numpy()
        if array.dtype != np.float32:
            return
        w = array.T if transposed else array
        n, k = w.shape
        reason = shape_reason(fmt, n, k)
        if decisions is not None:
            decisions.append(QuantDecision(f"constant[{n}x{k}]", (n, k), fmt.name, reason))
        if reason is None:
            words, scales = quantize_packed(fmt, np.ascontiguousarray(w))
            found[b] = _Packed(relax.const(words), relax.const(scales), n, k, transposed)

    relax.analysis.post_order_visit(func, visit)
    return found


def check_target(target, weights: str) -> TargetFormat:
    """The format named ``weights`` with ``target``'s dot-product route; an
    ``UnsupportedError`` where ``target`` has no route (an x86 CPU without AVX2, a GPU: the
    float32 path is the caller's fallback)."""
    fmt = get_format(weights)
    try:
        route = pick_quant_route(target)
    except UnsupportedError as err:
        raise UnsupportedError(f"weights={weights!r}: {err}; compile with weights='fp32'") \
            from None
    return TargetFormat(fmt.name, fmt.bits, route)


def quantize_for(mod: tvm.IRModule, target, weights: str,
                 report: Optional[list] = None) -> tvm.IRModule:
    """``quantize_constants`` in format ``weights`` on ``target``; each weight's decision is
    a report entry (kind "quant-weight", with its reason when it stays float32)."""
    fmt = check_target(target, weights)
    decisions: list = []
    out = quantize_constants(mod, fmt, decisions, report)
    if report is not None:
        report.extend(weight_entries(decisions))
    return out


def weight_entries(decisions: Sequence[QuantDecision]) -> List[dict]:
    """Report entries for the matrices' (and stacked experts') decisions: quantized ones as
    roller's, the others declined with their reason (vectors — norms' weights, biases — are not
    listed)."""
    return [FuncReport(f"weight {d.name}", "roller" if d.reason is None else "fallback",
                       kind="quant-weight", reason=d.reason or "",
                       fallback="" if d.reason is None else "decline").to_dict()
            for d in decisions if len(d.shape) in (2, 3) and not d.unused]
