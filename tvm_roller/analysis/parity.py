"""Transposed convolutions: the stride-parity guard, and one sub-convolution per output parity.

A transposed convolution of stride k written as a dense convolution over the dilated input
multiplies most of its taps by zero. TE's ``te_workload`` (suite T2D) keeps the guard in the
reduction itself::

    out[h] += if_then_else((h + rh + c) % k == 0, X[(h + rh + c) // k], 0) * W[rh]

topi's ``conv2d_transpose_*`` and Relax's legalized ``conv2d_transpose`` / ``conv1d_transpose``
dilate the input in a producer block (``data_dilate``: the same guard on its own index), pad
it (``data_pad``) and run a plain convolution over the result: the guard is found in the
reduction's operand once its producers are inlined.

Detection (:func:`find_parity_guard`): a condition ``(alpha*s + beta*r + c) % k == 0`` (s one
spatial axis, r at most one reduction axis, both affine) of an ``if_then_else(cond, x, 0)`` that
multiplies the reduction's update (directly or through its inlined producers).

Rewrite (:func:`decompose`): each output axis s in such a guard is split by its parity,
s = k_s*a + p, and in each class p the tap r keeps only the residues the guard admits,
r = d*j + q(p). The guard is then constant (true), and every index is affine: the input index
(s + r + c) // k becomes a + j + const. Each class is its own reduction block with its own
extents (axes not divisible by k; a class without taps writes the reduction's initial value),
accumulating into a compact buffer of the class's outputs; a copy (or the epilogue, restricted
to the class) writes the strided slice out[k_s*a + p]. (The reduction cannot write the slice
itself: a cache of its accumulators would write back the slice's whole bounding box.) A
producer the classes only read at one residue modulo g (``data_pad``: its odd rows are the
zeros of the dilation) is read through a dense copy of those elements (its producers inlined: a
plain padding block). With fewer output channels than vector lanes (NHWC, a 3-channel image)
the compact buffers and a copy of the input put the width innermost instead, so the width is
the vector axis. The producers the classes read form a prologue part; each class is a part of
its own (:class:`~tvm_roller.analysis.parts.Decomposition`).
"""
from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tvm
import tvm_ffi
from tvm import s_tir, sym, tirx
from tvm.ir.expr import Call, StringImm, TensorLoad

from tvm_roller.analysis.func import unwrap_func
from tvm_roller.analysis.parts import Decomposition

logger = logging.getLogger("tvm_roller")

_SPATIAL, _REDUCE = 0, 2  # tirx.IterVar.DataPar / CommReduce
_BINARY = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod,
           tirx.Min, tirx.Max, tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.And,
           tirx.Or)
_LEAVES = (tirx.Var, tirx.IntImm, tirx.FloatImm, StringImm)


class _NotHandled(Exception):
    """An expression or loop nest the rewrite does not rebuild: no decomposition."""


# -- expressions -----------------------------------------------------------------------------------
def _rewrite(e, fn):
    """``e`` rebuilt with ``fn(node)`` (a replacement, or None to recurse) applied top-down."""
    hit = fn(e)
    if hit is not None:
        return hit

    def rec(x):
        return _rewrite(x, fn)

    if isinstance(e, _LEAVES):
        return e
    if isinstance(e, _BINARY):
        return type(e)(rec(e.a), rec(e.b))
    if isinstance(e, tirx.Not):
        return tirx.Not(rec(e.a))
    if isinstance(e, tirx.Select):
        return tirx.Select(rec(e.condition), rec(e.true_value), rec(e.false_value))
    if isinstance(e, tirx.Cast):
        return tirx.Cast(e.ty, rec(e.value))
    if isinstance(e, TensorLoad):
        return tirx.BufferLoad(e.source, [rec(i) for i in e.indices])
    if isinstance(e, Call):
        return Call(e.op, [rec(a) for a in e.args], attrs=e.attrs, ret_ty=e.ty)
    if isinstance(e, tirx.Let):
        return tirx.Let(e.var, rec(e.value), rec(e.body))
    raise _NotHandled(f"expression node {type(e).__name__}")


def _loads(e) -> List[TensorLoad]:
    found: List[TensorLoad] = []

    def fn(node):
        if isinstance(node, TensorLoad):
            found.append(node)
            for i in node.indices:
                _rewrite(i, fn)
            return node
        return None

    _rewrite(e, fn)
    return found


def _substitute(exprs: Sequence, variables: Sequence, values: Sequence) -> List:
    """``exprs`` with ``variables`` replaced by ``values``, simplified (IndexMap does both)."""
    if not exprs:
        return []
    return list(tirx.IndexMap(list(variables), list(exprs), None).map_indices(list(values)))


def _simplify(e):
    return sym.Analyzer().simplify(e)


def _dtype(e) -> str:
    return str(e.ty.dtype)


def _const(value: int, like) -> tirx.IntImm:
    return tirx.const(int(value), _dtype(like))


def _is_zero(e) -> bool:
    return isinstance(e, (tirx.IntImm, tirx.FloatImm)) and e.value == 0


def _select(e):
    """(condition, then, else) of an if_then_else call or a Select; None otherwise."""
    if isinstance(e, tirx.Select):
        return e.condition, e.true_value, e.false_value
    if isinstance(e, Call) and str(getattr(e.op, "name", "")).endswith("if_then_else"):
        return tuple(e.args)
    return None


def _conjuncts(c) -> list:
    return _conjuncts(c.a) + _conjuncts(c.b) if isinstance(c, tirx.And) else [c]


def _multiplicative_conditions(e) -> list:
    """Conditions that, false, make ``e`` zero: those of an ``if_then_else(cond, x, 0)``
    reached through products and casts only (nested selects too)."""
    if isinstance(e, tirx.Mul):
        return _multiplicative_conditions(e.a) + _multiplicative_conditions(e.b)
    if isinstance(e, tirx.Cast):
        return _multiplicative_conditions(e.value)
    sel = _select(e)
    if sel is not None and _is_zero(sel[2]):
        return _conjuncts(sel[0]) + _multiplicative_conditions(sel[1])
    return []


def _inline(e, defs: Dict[int, Tuple[list, object]]):
    """``e`` with every load of a buffer in ``defs`` (buffer id -> its producer's iteration
    variables and value) replaced by the producer's value there, recursively."""
    def fn(node):
        if isinstance(node, TensorLoad) and node.source.id_ in defs:
            variables, value = defs[node.source.id_]
            idx = [_inline(i, defs) for i in node.indices]
            return _inline(_substitute([value], variables, idx)[0], defs)
        return None

    return _rewrite(e, fn)


def _affine(e, variables) -> Optional[Tuple[List[int], int]]:
    """(coefficients per variable, constant) when ``e`` is affine in ``variables``."""
    co = sym.detect_linear_equation(e, list(variables))
    if len(co) != len(variables) + 1 or not all(isinstance(c, tirx.IntImm) for c in co):
        return None
    return [int(c.value) for c in co[:-1]], int(co[-1].value)


def _position(variables, var) -> int:
    return next(i for i, v in enumerate(variables) if v.same_as(var))


def _divides(e, variables) -> bool:
    """Whether ``e`` divides or takes a remainder of an expression using ``variables``."""
    found = []

    def fn(node):
        if isinstance(node, (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)) and any(
                _uses(node.a, v) for v in variables):
            found.append(node)
        return None

    _rewrite(e, fn)
    return bool(found)


def _uses(e, var) -> bool:
    found = []
    _rewrite(e, lambda n: found.append(n) if isinstance(n, tirx.Var) and n.same_as(var)
             else None)
    return bool(found)


def _equal(a, b) -> bool:
    return bool(tvm_ffi.structural_equal(a, b))


# -- the function's loop nests --------------------------------------------------------------------
@dataclass
class _Nest:
    """One top-level loop nest of ``te.create_prim_func``'s form: loops bound one to one to a
    block's iteration variables (``loops`` None when not), around one block."""

    stmt: tirx.Stmt
    block: s_tir.SBlock
    loops: Optional[List[str]]  # the loop variables' names, in iteration-variable order

    @property
    def name(self) -> str:
        return self.block.name_hint

    @property
    def variables(self) -> list:
        return [iv.var for iv in self.block.iter_vars]

    @property
    def extents(self) -> List[int]:
        return [int(iv.dom.extent) for iv in self.block.iter_vars]

    @property
    def kinds(self) -> str:
        return "".join("R" if int(iv.iter_type) == _REDUCE else "S" for iv in self.block.iter_vars)

    @property
    def is_reduction(self) -> bool:
        return "R" in self.kinds

    def store(self) -> Optional[tirx.BufferStore]:
        return self.block.body if isinstance(self.block.body, tirx.BufferStore) else None


def _nest(stmt) -> _Nest:
    loops = []
    node = stmt
    while isinstance(node, tirx.For):
        loops.append(node)
        node = node.body
    if not isinstance(node, s_tir.SBlockRealize):
        raise _NotHandled("a top-level statement that is not a loop nest around one block")
    blk = node.block
    names = None
    trivial = len(loops) == len(blk.iter_vars) and all(
        v.same_as(l.loop_var) and _is_zero(l.min) for v, l in zip(node.iter_values, loops))
    pred = node.predicate
    if trivial and (pred is True or (isinstance(pred, tirx.IntImm) and pred.value == 1)):
        names = [str(l.loop_var.name) for l in loops]
    for iv in blk.iter_vars:
        if int(iv.iter_type) not in (_SPATIAL, _REDUCE) or not isinstance(iv.dom.extent,
                                                                           tirx.IntImm):
            raise _NotHandled(f"block {blk.name_hint}: an iterator that is not a static "
                              "spatial or reduction axis")
    return _Nest(stmt, blk, names)


def _nests(func: tirx.PrimFunc) -> Tuple[s_tir.SBlock, List[_Nest]]:
    body = func.body
    if not isinstance(body, s_tir.SBlockRealize) or body.block.name_hint != "root":
        raise _NotHandled("no root block")
    root = body.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    return root, [_nest(s) for s in stmts]


def _definition(n: _Nest) -> Optional[Tuple[int, list, object]]:
    """(buffer id, variables, value) of an injective block storing ``value`` at exactly its
    iteration variables: what inlining its buffer substitutes."""
    st = n.store()
    if st is None or n.is_reduction or n.block.init is not None:
        return None
    vs = n.variables
    if len(st.indices) != len(vs) or not all(i.same_as(v) for i, v in zip(st.indices, vs)):
        return None
    return st.buffer.id_, vs, st.value


@dataclass
class _Reduction:
    nest: _Nest
    out: tirx.Buffer
    indices: list  # the output indices: the spatial variables, one per output dimension
    update: object  # E in out[idx] = out[idx] + E
    init: object  # the initial value


def _reduction(n: _Nest) -> Optional[_Reduction]:
    st, init = n.store(), n.block.init
    if st is None or not isinstance(init, tirx.BufferStore) or not isinstance(st.value, tirx.Add):
        return None
    if not init.buffer.same_as(st.buffer) or len(init.indices) != len(st.indices) or not all(
            _equal(a, b) for a, b in zip(init.indices, st.indices)):
        return None
    for acc, e in ((st.value.a, st.value.b), (st.value.b, st.value.a)):
        if isinstance(acc, TensorLoad) and acc.source.same_as(st.buffer) and all(
                _equal(a, b) for a, b in zip(acc.indices, st.indices)):
            return _Reduction(n, st.buffer, list(st.indices), e, init.value)
    return None


# -- detection -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParityTerm:
    """``(alpha * axes[spatial] + beta * axes[reduction] + const) % modulus == 0`` (coefficients
    modulo ``modulus``; ``spatial`` / ``reduction`` None when the term has no such axis)."""

    modulus: int
    spatial: Optional[int]
    alpha: int
    reduction: Optional[int]
    beta: int
    const: int

    def text(self, axes: Sequence[str]) -> str:
        parts = [f"{c}*{axes[i]}" if c != 1 else axes[i]
                 for i, c in ((self.spatial, self.alpha), (self.reduction, self.beta))
                 if i is not None]
        lin = " + ".join(parts) + (f" + {self.const}" if self.const else "")
        return f"({lin}) % {self.modulus} == 0"


@dataclass(frozen=True)
class ParityClass:
    """One output parity class: the residue of each split axis, the class's extents, and per
    restricted tap axis its step, first residue and extent (``zero``: no tap is left)."""

    residues: Tuple[Tuple[int, int], ...]  # (axis, residue p) per split spatial axis
    extents: Tuple[Tuple[int, int], ...]  # (axis, extent of a) per split spatial axis
    taps: Tuple[Tuple[int, int, int, int], ...]  # (axis, step d, first q, extent of j)
    zero: bool


@dataclass(frozen=True)
class ParityGuard:
    """A reduction whose update a stride-parity guard multiplies (see the module doc)."""

    block: str
    axes: Tuple[str, ...]  # the block's iteration variables
    terms: Tuple[ParityTerm, ...]
    split: Tuple[Tuple[int, int], ...]  # (spatial axis, modulus k_s) of each split output axis
    classes: Tuple[ParityClass, ...]
    useful: float  # fraction of the block's multiply-adds the guard does not zero
    inlined: bool  # the guard is in the reduction's producers (found once they are inlined)

    def describe(self) -> str:
        return " and ".join(t.text([_short(a) for a in self.axes]) for t in self.terms)


def _short(name: str) -> str:
    return name[2:] if name.startswith("v_") else name


def _parity_term(c, variables, kinds: str) -> Optional[ParityTerm]:
    if not isinstance(c, tirx.EQ):
        return None
    for lhs, rhs in ((c.a, c.b), (c.b, c.a)):
        if not (isinstance(lhs, tirx.FloorMod) and isinstance(lhs.b, tirx.IntImm)
                and isinstance(rhs, tirx.IntImm)):
            continue
        k = int(lhs.b.value)
        if k < 2 or not 0 <= int(rhs.value) < k:
            return None
        aff = _affine(lhs.a, variables)
        if aff is None:
            return None
        coeffs = [x % k for x in aff[0]]
        const = (aff[1] - int(rhs.value)) % k
        sp = [i for i, x in enumerate(coeffs) if x and kinds[i] == "S"]
        rd = [i for i, x in enumerate(coeffs) if x and kinds[i] == "R"]
        if len(sp) > 1 or len(rd) > 1 or not (sp or rd):
            return None
        s = sp[0] if sp else None
        r = rd[0] if rd else None
        return ParityTerm(k, s, coeffs[s] if sp else 0, r, coeffs[r] if rd else 0, const)
    return None


def _classes(terms: Sequence[ParityTerm], split: Sequence[Tuple[int, int]],
             extents: Sequence[int]) -> List[ParityClass]:
    out = []
    for residues in itertools.product(*[range(k) for _, k in split]):
        p = dict(zip([s for s, _ in split], residues))
        sizes = [(s, -(-(extents[s] - p[s]) // k)) for s, k in split]
        if any(a <= 0 for _, a in sizes):
            continue  # the output axis is shorter than the residue: an empty class
        taps, zero = [], False
        for t in terms:
            sval = t.alpha * p[t.spatial] if t.spatial is not None else 0
            if t.reduction is None:
                zero = zero or (sval + t.const) % t.modulus != 0
                continue
            valid = [q for q in range(t.modulus)
                     if (sval + t.beta * q + t.const) % t.modulus == 0]
            if not valid:
                zero = True
                continue
            d = t.modulus // len(valid)
            q0 = valid[0]
            ext = -(-(extents[t.reduction] - q0) // d) if q0 < extents[t.reduction] else 0
            zero = zero or ext <= 0
            taps.append((t.reduction, d, q0, max(ext, 0)))
        out.append(ParityClass(tuple(zip([s for s, _ in split], residues)), tuple(sizes),
                               tuple(taps), zero))
    return out


def _useful(classes: Sequence[ParityClass], split, restricted: Sequence[int],
            extents: Sequence[int]) -> float:
    total = math.prod(extents[s] for s, _ in split) * math.prod(extents[r] for r in restricted)
    kept = 0
    for c in classes:
        if not c.zero:
            kept += math.prod(a for _, a in c.extents) * math.prod(j for *_, j in c.taps)
    return kept / total if total else 1.0


@dataclass
class _Found:
    guard: ParityGuard
    root: s_tir.SBlock
    nests: List[_Nest]
    main: int  # index of the reduction's nest
    red: _Reduction
    defs: Dict[int, Tuple[list, object]]


def _find(func: tirx.PrimFunc) -> Optional[_Found]:
    try:
        root, nests = _nests(func)
    except _NotHandled:
        return None
    reductions = [i for i, n in enumerate(nests) if n.is_reduction]
    if len(reductions) != 1:
        return None
    m = reductions[0]
    main = nests[m]
    red = _reduction(main)
    if red is None or main.loops is None:
        return None
    variables, kinds = main.variables, main.kinds
    spatial = [v for v, k in zip(variables, kinds) if k == "S"]
    if len(red.indices) != len(spatial) or not all(
            any(i.same_as(v) for v in spatial) for i in red.indices) or len(
            {i.name for i in red.indices}) != len(spatial):
        return None  # the output is not indexed by the spatial axes one to one
    defs = {}
    for n in nests[:m]:
        d = _definition(n)
        if d is not None:
            defs[d[0]] = (d[1], d[2])
    try:
        own = _multiplicative_conditions(red.update)
        full = own if not defs else _multiplicative_conditions(_inline(red.update, defs))
    except _NotHandled:
        return None
    terms: List[ParityTerm] = []
    for c in full:
        t = _parity_term(c, variables, kinds)
        if t is not None and t not in terms:
            terms.append(t)
    if not terms:
        return None
    used = [i for t in terms for i in (t.spatial, t.reduction) if i is not None]
    if len(used) != len(set(used)):
        return None  # an axis in two guards: not a plain stride parity
    split = [(t.spatial, t.modulus // math.gcd(t.alpha, t.modulus)) for t in terms
             if t.spatial is not None]
    restricted = [t.reduction for t in terms if t.reduction is not None]
    classes = _classes(terms, split, main.extents)
    useful = _useful(classes, split, restricted, main.extents)
    if not classes or useful >= 1.0:
        return None
    own_terms = {_parity_term(c, variables, kinds) for c in own}
    guard = ParityGuard(main.name, tuple(str(v.name) for v in variables), tuple(terms),
                        tuple(split), tuple(classes), useful,
                        inlined=not all(t in own_terms for t in terms))
    return _Found(guard, root, nests, m, red, defs)


def find_parity_guard(func) -> Optional[ParityGuard]:
    """The stride-parity guard of ``func``'s reduction (see the module doc), or None."""
    found = _find(unwrap_func(func))
    return found.guard if found is not None else None


# -- the rewrite -----------------------------------------------------------------------------------
def _loop_nest(block: s_tir.SBlock, names: Sequence[str]) -> tirx.Stmt:
    """``block`` under one serial loop per iteration variable, bound one to one."""
    loops = [tirx.Var(n, _dtype(iv.var)) for n, iv in zip(names, block.iter_vars)]
    stmt = s_tir.SBlockRealize(loops, True, block)
    for lv, iv in reversed(list(zip(loops, block.iter_vars))):
        stmt = tirx.For(lv, _const(0, lv), iv.dom.extent, tirx.ForKind.SERIAL, stmt)
    return stmt


def _block(name: str, variables, extents, kinds: str, body, init, buffers) -> s_tir.SBlock:
    ivs = [tirx.IterVar(tvm.ir.Range.from_min_extent(_const(0, v), _const(e, v)), v,
                        _REDUCE if k == "R" else _SPATIAL)
           for v, e, k in zip(variables, extents, kinds)]
    blk = s_tir.SBlock(ivs, [], [], name, body, init)
    reads, writes = s_tir.analysis.get_sblock_read_write_region(blk, {b: b for b in buffers})
    return s_tir.SBlock(ivs, reads, writes, name, body, init)


def _buffer(shape: Sequence[int], like: tirx.Buffer, name: str) -> tirx.Buffer:
    return tirx.decl_buffer([_const(s, like.shape[0]) for s in shape], str(like.dtype), name)


def _rename_loads(e, renames: Dict[int, Tuple[tirx.Buffer, object]]):
    """Loads of the buffers in ``renames`` (id -> (new buffer, index map)) redirected."""
    def fn(node):
        if isinstance(node, TensorLoad) and node.source.id_ in renames:
            buf, index = renames[node.source.id_]
            return tirx.BufferLoad(buf, index([_rewrite(i, fn) for i in node.indices]))
        return None

    return _rewrite(e, fn)


@dataclass
class _ClassBlocks:
    tag: str
    label: str
    blocks: List[Tuple[s_tir.SBlock, List[str]]]  # (block, loop names) in order
    allocs: List[tirx.Buffer]


def _tag(guard: ParityGuard, cls: ParityClass) -> Tuple[str, str]:
    short = [(_short(guard.axes[s]), p, k) for (s, p), (_, k) in zip(cls.residues, guard.split)]
    return ("_".join(f"{n}{p}" for n, p, _ in short),
            " ".join(f"{n}%{k}={p}" for n, p, k in short))


def decompose(func, vector_lanes: int = 0) -> Optional[Decomposition]:
    """``func`` rewritten into a prologue and one part per output parity class (see the module
    doc), or None when it has no stride-parity guard or a form the rewrite does not take.

    ``vector_lanes`` (the target's vector width for the dtype; 0: no preference): when the
    output's contiguous axis (the channels of NHWC) is shorter and the classes' innermost
    split axis (the width) longer, each class accumulates with the width innermost and reads
    its input through a copy with the width innermost, so the width is the vector axis."""
    func = unwrap_func(func)
    found = _find(func)
    if found is None:
        return None
    try:
        return _decompose(func, found, vector_lanes)
    except _NotHandled as err:
        logger.info("tvm_roller: %s has a stride parity guard but is not decomposed: %s",
                    found.guard.block, err)
        return None


@dataclass(frozen=True)
class _Setting:
    """What every step of the rewrite reads: the reduction's nest, its axes, how the guard
    splits its output, and the function's buffers."""

    f: _Found
    params: set  # ids of the function's parameters
    variables: list  # the reduction's iteration variables
    extents: List[int]
    kinds: str
    split_k: Dict[int, int]  # spatial axis -> its modulus k_s
    split_dims: Dict[int, int]  # output dim -> its split spatial axis
    ndim: int  # of the output
    consumers: List[_Nest]  # the epilogue: the nests after the reduction
    all_buffers: List[tirx.Buffer]  # the parameters and the root's allocations

    @property
    def main(self) -> _Nest:
        return self.f.nests[self.f.main]


@dataclass(frozen=True)
class _Copies:
    """The copies the classes read instead of a producer or an input, and the compact
    buffers' layout."""

    dense: Dict[int, "_Dense"]  # by buffer id: a producer read at one residue only
    transposed: Dict[int, "_Dense"]  # by buffer id: an input with the width innermost
    renames: Dict[int, Tuple[tirx.Buffer, object]]  # loads redirected to the copies
    allocs: List[tirx.Buffer]  # the copies' buffers
    order: List[int]  # the compact buffers' dimension order
    width: Optional[int]  # the output dim made innermost (None: the layout is kept)


def _decompose(func: tirx.PrimFunc, f: _Found, vector_lanes: int = 0) -> Decomposition:
    s = _setting(func, f)
    # per class: (new variables, substituted update or None for a zero class)
    updates = [_class_update(s, cls) for cls in f.guard.classes]
    copies = _copies(s, updates, vector_lanes)
    classes = [_class_blocks(s, copies, entry) for entry in updates]
    # the prologue: the producers the classes (and the dense copies) read, in their order
    prologue = _prologue(f, classes, copies)
    new, groups, labels = _assemble(func, f, prologue, copies, classes)
    reason, notes = _explain(s, copies, classes, vector_lanes)
    return Decomposition("parity", reason, new, tuple(groups), tuple(labels), tuple(notes))


def _setting(func: tirx.PrimFunc, f: _Found) -> _Setting:
    guard, red, main = f.guard, f.red, f.nests[f.main]
    params = {p.id_ for p in func.params}
    variables, extents, kinds = main.variables, main.extents, main.kinds
    dim_of = {v.name: d for d, v in enumerate(red.indices)}  # output dim of a spatial axis
    split_k = dict(guard.split)
    split_dims = {dim_of[variables[s].name]: s for s in split_k}
    ndim = len(red.indices)
    consumers = f.nests[f.main + 1:]
    all_buffers = list(func.params) + list(f.root.alloc_buffers)
    return _Setting(f, params, variables, extents, kinds, split_k, split_dims, ndim, consumers,
                    all_buffers)


def _class_update(s: _Setting, cls: ParityClass) -> tuple:
    """The class's (class, new variables, extents, values of the old variables, substituted
    update or None for a zero class)."""
    red, split_k = s.f.red, s.split_k
    p = dict(cls.residues)
    a_ext = dict(cls.extents)
    taps = {r: (d, q0, j) for r, d, q0, j in cls.taps}
    new_vars, new_ext, values = [], [], []
    for i, (v, e) in enumerate(zip(s.variables, s.extents)):
        nv = tirx.Var(str(v.name), _dtype(v))
        if i in split_k:
            values.append(_const(split_k[i], v) * nv + _const(p[i], v))
            e = a_ext[i]
        elif i in taps:
            d, q0, j = taps[i]
            values.append(_const(d, v) * nv + _const(q0, v))
            e = j
        else:
            values.append(nv)
        new_vars.append(nv)
        new_ext.append(e)
    update = None if cls.zero else _substitute([red.update], s.variables, values)[0]
    if update is not None:  # the split axes and the taps now index affinely
        moved = [new_vars[i] for i in list(split_k) + list(taps)]
        for ld in _loads(update):
            if any(_divides(i, moved) for i in ld.indices):
                raise _NotHandled(f"a load of {ld.source.name} stays non-affine in the "
                                  f"split axes in class {cls.residues}: {ld}")
    return cls, new_vars, new_ext, values, update


def _copies(s: _Setting, updates, vector_lanes: int) -> _Copies:
    f, red = s.f, s.f.red
    # a producer the classes read at one residue modulo g along a dimension only: a dense copy
    dense = _dense_copies(f, [(u, nv) for _, nv, _, _, u in updates if u is not None],
                          s.all_buffers)
    dense_renames = {bid: (d.buffer, d.index) for bid, d in dense.items()}
    new_allocs: List[tirx.Buffer] = [d.buffer for d in dense.values()]

    # few channels innermost: the width innermost instead (compact buffers and inputs)
    order = list(range(s.ndim))  # the compact buffers' dimension order
    transposed: Dict[int, _Dense] = {}
    width = _width_innermost(red, s.variables, s.extents, s.split_dims, f.guard, vector_lanes)
    if width is not None:
        order = [d for d in range(s.ndim) if d != width] + [width]
        transposed = _transposed_copies(f, updates, red, s.variables, width, dense,
                                        s.all_buffers)
        dense_renames.update({bid: (t.buffer, t.index) for bid, t in transposed.items()})
        new_allocs += [t.buffer for t in transposed.values()]
    return _Copies(dense, transposed, dense_renames, new_allocs, order, width)


def _class_blocks(s: _Setting, c: _Copies, entry: tuple) -> _ClassBlocks:
    """The class's blocks: its reduction into a compact buffer, the copy of its strided slice
    of the output, and the epilogue restricted to the class (``entry``: the class's update)."""
    cls, new_vars, new_ext, values, update = entry
    red, main, order = s.f.red, s.main, c.order
    split_dims, split_k = s.split_dims, s.split_k
    tag, label = _tag(s.f.guard, cls)
    p = dict(cls.residues)
    # the output dims: the class's variable, its extent, and the index in the full output
    pos = [_position(s.variables, i) for i in red.indices]
    out_vars = [new_vars[i] for i in pos]
    out_ext = [new_ext[i] for i in pos]
    full_idx = [values[i] for i in pos]
    allocs: List[tirx.Buffer] = []
    local: Dict[int, Tuple[tirx.Buffer, object]] = {}  # class-local buffers: id -> (buf, map)

    def localise(buf: tirx.Buffer) -> tirx.Buffer:
        """The class's own compact copy of an output-shaped buffer (the class's extents,
        its dimensions in ``order``)."""
        nb = _buffer([out_ext[d] for d in order], buf, f"{buf.name}_{tag}")
        allocs.append(nb)

        def index(idx, _p=p):
            compact = [_simplify(tirx.floordiv(i - _const(_p[split_dims[d]], i),
                                               _const(split_k[split_dims[d]], i)))
                       if d in split_dims else i for d, i in enumerate(idx)]
            return [compact[d] for d in order]

        local[buf.id_] = (nb, index)
        return nb

    blocks = []
    main_out = localise(red.out)
    out_idx = [out_vars[d] for d in order]
    init = _substitute([red.init], s.variables, values)[0]
    bufs = s.all_buffers + c.allocs + allocs
    if update is None:  # no tap left: the reduction's initial value
        sp = [i for i, k in enumerate(s.kinds) if k == "S"]
        body = tirx.BufferStore(main_out, init, out_idx)
        blk = _block(f"{main.name}_{tag}", [new_vars[i] for i in sp],
                     [new_ext[i] for i in sp], "S" * len(sp), body, None, bufs)
        blocks.append((blk, [main.loops[i] for i in sp]))
    else:
        upd = _rename_loads(update, c.renames)
        acc = tirx.BufferLoad(main_out, out_idx)
        body = tirx.BufferStore(main_out, acc + upd, out_idx)
        blk = _block(f"{main.name}_{tag}", new_vars, new_ext, s.kinds, body,
                     tirx.BufferStore(main_out, init, out_idx), bufs)
        blocks.append((blk, list(main.loops)))
    if red.out.id_ in s.params:  # the class's slice of the output: a strided copy
        cv = [tirx.Var(str(v.name), _dtype(v)) for v in out_vars]
        body = tirx.BufferStore(red.out, tirx.BufferLoad(main_out, [cv[d] for d in order]),
                                _substitute(full_idx, out_vars, cv))
        blk = _block(f"{main.name}_{tag}_out", cv, out_ext, "S" * s.ndim, body, None, bufs)
        blocks.append((blk, [main.loops[i] for i in pos]))
    for q in s.consumers:
        blocks.append(_restrict(q, red, local, localise, split_dims, split_k, p, out_ext,
                                s.params, tag, lambda: s.all_buffers + c.allocs + allocs))
    return _ClassBlocks(tag, label, blocks, allocs)


def _prologue(f: _Found, classes: Sequence[_ClassBlocks], c: _Copies) -> List[_Nest]:
    """The producers the classes (and the dense copies) read, in their order."""
    produced = {w.source.id_: i for i, n in enumerate(f.nests[:f.main])
                for w in n.block.writes}
    wanted = set()
    pending = [r.source.id_ for cb in classes for blk, _ in cb.blocks for r in blk.reads]
    pending += [r.source.id_ for d in list(c.dense.values()) + list(c.transposed.values())
                for r in d.block.reads]
    while pending:
        bid = pending.pop()
        if bid in produced and produced[bid] not in wanted:
            wanted.add(produced[bid])
            pending += [r.source.id_ for r in f.nests[produced[bid]].block.reads]
    return [f.nests[i] for i in sorted(wanted)]


def _assemble(func: tirx.PrimFunc, f: _Found, prologue: Sequence[_Nest], c: _Copies,
              classes: Sequence[_ClassBlocks]) -> Tuple[tirx.PrimFunc, list, list]:
    """The rewritten function (the prologue, the copies, then each class's blocks) with its
    parts' block groups and labels."""
    kept_allocs = [b for b in f.root.alloc_buffers
                   if any(w.source.same_as(b) for n in prologue for w in n.block.writes)]

    stmts = [n.stmt for n in prologue]
    groups, labels = [], []
    pro_names = [n.name for n in prologue]
    for d in list(c.dense.values()) + list(c.transposed.values()):
        stmts.append(_loop_nest(d.block, [f"ax{i}" for i in range(len(d.block.iter_vars))]))
        pro_names.append(d.block.name_hint)
    if pro_names:
        groups.append(tuple(pro_names))
        labels.append("prologue")
    for cb in classes:
        stmts += [_loop_nest(blk, names) for blk, names in cb.blocks]
        groups.append(tuple(blk.name_hint for blk, _ in cb.blocks))
        labels.append(cb.label)
    root = s_tir.SBlock([], [], [], "root", tirx.SeqStmt(stmts),
                        alloc_buffers=kept_allocs + c.allocs + [b for cb in classes
                                                                for b in cb.allocs])
    new = tirx.PrimFunc(func.params, s_tir.SBlockRealize([], True, root), func.ret_type,
                        func.attrs)
    if not s_tir.analysis.verify_well_formed(new, assert_mode=False):
        raise _NotHandled("the rewritten function is not well formed")
    return new, groups, labels


def _explain(s: _Setting, c: _Copies, classes: Sequence[_ClassBlocks],
             vector_lanes: int) -> Tuple[str, List[str]]:
    """The decomposition's reason and notes."""
    guard, red, variables = s.f.guard, s.f.red, s.variables
    zero_classes = sum(1 for cls in guard.classes if cls.zero)
    where = "its inlined producers" if guard.inlined else "the reduction"
    reason = (f"decomposed by output parity: {guard.block} multiplies "
              f"{1 - guard.useful:.0%} of its multiply-adds by the zero of the stride parity "
              f"guard {guard.describe()} (in {where}); {len(classes)} sub-convolutions, one per "
              f"class of " + ", ".join(_short(guard.axes[sp]) + f" mod {k}"
                                      for sp, k in guard.split)
              + ", each over its own taps with affine indices")
    notes = []
    if zero_classes:
        notes.append(f"{zero_classes} class(es) without taps: the initial value is written")
    for d in c.dense.values():
        notes.append(f"{d.source} is read at one residue modulo {d.step} only (the zeros of "
                     f"the dilation are skipped): the classes read its dense copy {d.buffer.name}"
                     ", its producers inlined")
    if c.width is not None:
        chan, wide = _short(red.indices[-1].name), _short(red.indices[c.width].name)
        notes.append(f"{chan} ({s.extents[_position(variables, red.indices[-1])]}) is shorter "
                     f"than {vector_lanes} vector lanes: the classes accumulate with {wide} "
                     "innermost" + (", reading " + ", ".join(t.buffer.name for t in
                                                            c.transposed.values())
                                    + f" (a copy of their input with {wide} innermost)"
                                    if c.transposed else ""))
    notes.append("each class accumulates into a compact buffer, then writes its strided slice "
                 f"of {_final_name(red, s.consumers)}" + (" through the epilogue" if s.consumers
                                                          else ""))
    return reason, notes


def _final_name(red: _Reduction, consumers: Sequence[_Nest]) -> str:
    return consumers[-1].store().buffer.name if consumers else red.out.name


def _restrict(q: _Nest, red: _Reduction, local, localise, split_dims, split_k, p, out_ext,
              params, tag: str, buffers):
    """An epilogue block restricted to the class: its output dims split as the reduction's
    output, class-local intermediates read and written through their class copies."""
    st = q.store()
    if st is None or q.is_reduction or q.loops is None or q.block.init is not None:
        raise _NotHandled(f"epilogue block {q.name} is not a plain elementwise block")
    qv = q.variables
    if len(st.indices) != len(red.indices) or len({i.name for i in st.indices
                                                   if isinstance(i, tirx.Var)}) != len(qv) or \
            not all(any(i.same_as(v) for v in qv) for i in st.indices) or \
            [int(s) for s in st.buffer.shape] != [int(s) for s in red.out.shape]:
        raise _NotHandled(f"epilogue block {q.name} does not iterate over the output")
    reads_local = False
    for ld in _loads(st.value):
        if ld.source.id_ in local:
            if not all(_equal(a, b) for a, b in zip(ld.indices, st.indices)):
                raise _NotHandled(f"epilogue block {q.name} reads {ld.source.name} at other "
                                  "indices than it writes")
            reads_local = True
    if not reads_local:
        raise _NotHandled(f"block {q.name} after the reduction does not read its output")
    pos = {i.name: d for d, i in enumerate(st.indices)}
    new_vars, new_ext, values = [], [], []
    for v, e in zip(qv, q.extents):
        d = pos[v.name]
        nv = tirx.Var(str(v.name), _dtype(v))
        if d in split_dims:
            s = split_dims[d]
            values.append(_const(split_k[s], v) * nv + _const(p[s], v))
            e = out_ext[d]
        else:
            values.append(nv)
        new_vars.append(nv)
        new_ext.append(e)
    value = _rename_loads(st.value, local)
    if st.buffer.id_ in params:
        out, idx = st.buffer, list(st.indices)
    else:
        out = localise(st.buffer)
        idx = local[st.buffer.id_][1](list(st.indices))
    value, *idx = _substitute([value, *idx], qv, values)
    blk = _block(f"{q.name}_{tag}", new_vars, new_ext, "S" * len(qv),
                 tirx.BufferStore(out, value, idx), None, buffers())
    return blk, list(q.loops)


def _width_innermost(red: _Reduction, variables, extents, split_dims, guard: ParityGuard,
                     vector_lanes: int) -> Optional[int]:
    """The output dimension to make innermost in the classes' compact buffers instead of the
    contiguous one (None: keep the layout): the innermost split dimension, when the contiguous
    dimension is not split, is shorter than ``vector_lanes`` and shorter than it."""
    last = len(red.indices) - 1
    if not vector_lanes or last in split_dims or not split_dims:
        return None
    width = max(split_dims)
    chan = extents[_position(variables, red.indices[last])]
    shortest = min(dict(c.extents)[split_dims[width]] for c in guard.classes)
    return width if chan < vector_lanes and shortest > chan else None


def _transposed_copies(f: _Found, updates, red: _Reduction, variables, width: int, dense,
                       buffers) -> Dict[int, "_Dense"]:
    """Copies of the inputs the classes read along their width axis (``width``, an output
    dimension) in another dimension than the innermost: that dimension moved innermost (a
    padded input: padding and transpose in one copy, its producers inlined)."""
    pos = _position(variables, red.indices[width])
    dims: Dict[int, set] = {}
    bufs: Dict[int, tirx.Buffer] = {}
    for cls, nv, _, _, upd in updates:
        if upd is None:
            continue
        w = nv[pos]
        for ld in _loads(upd):
            used = [d for d, i in enumerate(ld.indices) if _uses(i, w)]
            dims.setdefault(ld.source.id_, set()).update(used)
            bufs[ld.source.id_] = ld.source
    out = {}
    for bid, used in dims.items():
        buf = bufs[bid]
        last = len(buf.shape) - 1
        if len(used) != 1 or last in used or bid in dense:
            continue
        e = next(iter(used))
        perm = [d for d in range(len(buf.shape)) if d != e] + [e]
        uvars = [tirx.Var(f"v{i}", _dtype(buf.shape[0])) for i in range(len(buf.shape))]
        value = _simplify(_inline(tirx.BufferLoad(buf, uvars), f.defs))
        shape = [int(buf.shape[d]) for d in perm]
        copy = _buffer(shape, buf, f"{buf.name}_t")
        pvars = [uvars[d] for d in perm]
        blk = _block(f"{buf.name}_t", pvars, shape, "S" * len(shape),
                     tirx.BufferStore(copy, value, pvars), None, list(buffers) + [copy])

        def index(idx, _perm=tuple(perm)):
            return [idx[d] for d in _perm]

        out[bid] = _Dense(str(buf.name), copy, index, blk, 1)
    return out


@dataclass
class _Dense:
    """A dense copy of the elements of a producer's buffer the classes read."""

    source: str  # the producer's buffer
    buffer: tirx.Buffer  # the copy
    index: Callable  # the producer's index -> the copy's
    block: s_tir.SBlock  # the copy's block (the producers inlined)
    step: int


def _dense_copies(f: _Found, updates: Sequence[Tuple[object, list]],
                  buffers: Sequence[tirx.Buffer]) -> Dict[int, _Dense]:
    """Producers the classes read at one residue r modulo g > 1 along some dimensions
    (``data_pad`` under a dilation: its other elements are zeros), by buffer id."""
    reads: Dict[int, List[Tuple[TensorLoad, list]]] = {}
    for upd, nv in updates:
        for ld in _loads(upd):
            if ld.source.id_ in f.defs:
                reads.setdefault(ld.source.id_, []).append((ld, nv))
    out = {}
    for bid, lds in reads.items():
        buf = lds[0][0].source
        steps = []
        for d in range(len(buf.shape)):
            g, residues = 0, set()
            for ld, nv in lds:
                aff = _affine(ld.indices[d], nv)
                if aff is None:  # e.g. a group's channel offset c // 3 * 2: kept as it is
                    g = 1
                    break
                for x in aff[0]:
                    g = math.gcd(g, x)
                residues.add(aff[1])
            if g > 1 and len({c % g for c in residues}) == 1:
                steps.append((g, next(iter(residues)) % g))
            else:
                steps.append((1, 0))
        if all(g == 1 for g, _ in steps):
            continue
        shape = [-(-(int(s) - r) // g) for s, (g, r) in zip(buf.shape, steps)]
        dense = _buffer(shape, buf, f"{buf.name}_dense")
        uvars = [tirx.Var(f"v{i}", _dtype(buf.shape[0])) for i in range(len(shape))]
        src = [_const(g, u) * u + _const(r, u) if g > 1 else u
               for u, (g, r) in zip(uvars, steps)]
        value = _simplify(_inline(tirx.BufferLoad(buf, src), f.defs))
        blk = _block(f"{buf.name}_dense", uvars, shape, "S" * len(shape),
                     tirx.BufferStore(dense, value, uvars), None, list(buffers) + [dense])

        def index(idx, _steps=tuple(steps)):
            return [_simplify(tirx.floordiv(i - _const(r, i), _const(g, i))) if g > 1 else i
                    for i, (g, r) in zip(idx, _steps)]

        out[bid] = _Dense(str(buf.name), dense, index, blk, max(g for g, _ in steps))
    return out
