"""Functions with symbolic extents: one kernel per bucket, dispatched at run time.

A function whose shapes name shape variables (``(n, 768)``: a dynamic sequence length) is
planned for a set of buckets of each variable: powers of two between its bounds (Relax's
``tir_var_lower_bound`` / ``tir_var_upper_bound``, or ``DEFAULT_UPPER``), or the user's.
Bucket ``(lo, hi]`` is planned at ``hi`` (the static function at that value, through the same
plan path as any function), and its kernel is that plan's schedule *replayed on the symbolic
function*: the trace is recorded with plain splits (``analysis.schedule.plain_splits``), whose
outer factor TVM infers from the extent, and the axes that follow a variable are padded to
their task tile (``FuncAnalysis.dynamic_axes``), so the micro-kernel has no predicate and the
tail is safe. The backend's policy sizes that task tile with the padding's extra work over the
whole bucket counted (``RTile.bucket_waste``); a bucket that still pads more than
``REFINE_WASTE`` is split in two (one variable, up to ``MAX_BUCKETS``; not the user's
buckets, which are kept as given). Neighbouring buckets
whose schedules are the same trace share one kernel. The kernels
are stitched into one function that picks its kernel from the variables' values
(``analysis.symbolic.dispatch``); the last bucket's kernel also takes any larger value.

Each bucket is planned through ``plan_prepared`` like any function, so its tiles come from (and
go to) the schedule cache under the bucket. What a backend cannot plan or replay (a decomposed
function, an unfused chain, a schedule step that needs a static extent) is an UnsupportedError
with the reason: the caller falls back.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time
import warnings
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from tvm import s_tir, tirx

from tvm_roller.analysis import symbolic
from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.analysis.schedule import block_names, plain_splits
from tvm_roller.core.errors import UnsupportedError, first_lines
from tvm_roller.planner.context import Context, InContext
from tvm_roller.planner.lower import lower
from tvm_roller.planner.plan import Plan, plan_prepared
from tvm_roller.planner.prepare import prepare


#: the upper bound assumed for a shape variable nobody bounded (buckets stop there; the last
#: bucket's kernel takes any larger value too)
DEFAULT_UPPER = 4096
#: at most this many buckets (kernels before merging) per function
MAX_BUCKETS = 16
#: a bucket whose kernel's run-time padding costs more than this fraction of extra work
#: somewhere in it is split in two (while the function has fewer than MAX_BUCKETS)
REFINE_WASTE = 0.25

Bounds = Mapping[str, Tuple[Optional[int], Optional[int]]]


@dataclass(frozen=True)
class Case:
    """One bucket: the values it takes (``lo < v <= hi`` per variable; the last bucket of a
    variable has no upper end), the values it was planned at, and its plan."""

    ranges: Tuple[Tuple[str, int, Optional[int]], ...]  # (variable, lo exclusive, hi or None)
    planned_at: Tuple[Tuple[str, int], ...]
    plan: Plan
    trace: Optional[s_tir.Trace] = None  # the schedule to replay on the symbolic function

    def label(self) -> str:
        parts = []
        for name, lo, hi in self.ranges:
            first = lo + 1
            parts.append(f"{name} >= {first}" if hi is None else
                         f"{name} = {first}" if hi == first else f"{name} in {first}..{hi}")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        tile = self.plan.tiles[0]
        return {"values": self.label(), "planned_at": dict(self.planned_at),
                "kind": tile.kind, "reg": list(tile.reg), "l2": list(tile.l2),
                "predicted_s": self.plan.predicted_s}


@dataclass(frozen=True)
class DynamicPlan(InContext):
    """What roller constructed for a function with symbolic extents. Immutable."""

    func: tirx.PrimFunc  # the symbolic function, as given
    variables: Tuple[str, ...]
    bounds: Tuple[Tuple[str, int, int], ...]  # (variable, lower, upper) the buckets span
    cases: Tuple[Case, ...]
    ctx: Context
    notes: Tuple[str, ...] = ()
    construct_s: float = 0.0

    @property
    def kind(self) -> str:
        return self.cases[-1].plan.tiles[0].kind

    @property
    def from_cache(self) -> bool:
        """Every bucket's tiles came from the schedule cache."""
        return all(c.plan.from_cache for c in self.cases)

    def buckets(self) -> List[dict]:
        return [c.to_dict() for c in self.cases]


def default_buckets(lower: int, upper: int) -> List[int]:
    """Bucket upper ends for a variable in ``[lower, upper]``: the powers of two from the first
    at or above ``lower`` (the small sizes, where a GEMV-like tile wins, each get their own),
    and ``upper``."""
    lower, upper = max(1, lower), max(1, lower, upper)
    ends, p = [], 1
    while p < upper:
        if p >= lower:
            ends.append(p)
        p *= 2
    ends.append(upper)
    return ends


def _thin(ends: List[int]) -> List[int]:
    """Every other bucket end dropped, the first and last kept."""
    if len(ends) <= 2:
        return ends[-1:]
    return sorted(set(ends[:1] + ends[2:-1:2] + ends[-1:]))


def bucket_grid(variables: Sequence[str], bounds: Mapping[str, Tuple[int, int]],
                buckets: Optional[Mapping[str, Sequence[int]]] = None,
                limit: int = MAX_BUCKETS) -> Dict[str, List[int]]:
    """Bucket ends per variable (the user's where given), thinned until their product is at
    most ``limit``."""
    unknown = sorted(set(buckets or {}) - set(variables))
    if unknown:
        warnings.warn(f"buckets given for {', '.join(unknown)}, which is not a shape variable "
                      f"of the function ({', '.join(variables)}): torch.export names them "
                      "(s0, s27, ...); the Relax function's tir_var_upper_bound shows the names",
                      UserWarning, stacklevel=3)
    grid = {}
    for name in variables:
        lo, hi = bounds[name]
        given = (buckets or {}).get(name)
        ends = sorted({int(e) for e in given if lo <= int(e)}) if given else \
            default_buckets(lo, hi)
        if not ends or any(e < 1 for e in ends):
            raise ValueError(f"buckets for {name} must be positive sizes >= its lower bound {lo}")
        grid[name] = ends
    while math.prod(len(e) for e in grid.values()) > limit:
        longest = max(grid, key=lambda n: len(grid[n]))
        grid[longest] = _thin(grid[longest])
    return grid


def _bounds_of(variables: Sequence[str], bounds: Optional[Bounds]) -> Tuple[Dict[str, Tuple[int, int]], List[str]]:
    out, notes = {}, []
    for name in variables:
        lo, hi = (bounds or {}).get(name, (None, None))
        lo = 1 if lo is None else max(1, int(lo))
        if hi is None:
            hi = max(lo, DEFAULT_UPPER)
            notes.append(f"{name} has no upper bound: buckets up to {hi}, the last bucket's "
                         "kernel takes any larger value")
        out[name] = (lo, max(lo, int(hi)))
    return out, notes


def plan_dynamic(func, ctx: Context, bounds: Optional[Bounds] = None,
                 buckets: Optional[Mapping[str, Sequence[int]]] = None) -> DynamicPlan:
    """Plan a function with symbolic extents: one plan per bucket (see the module doc).
    ``bounds``: variable -> (lower, upper), either None; ``buckets``: variable -> bucket upper
    ends, instead of the powers of two. UnsupportedError when a bucket cannot be planned."""
    t0 = time.perf_counter()
    func = symbolic.unwrap_func(func)
    variables = tuple(symbolic.shape_vars(func))
    if not variables:
        raise ValueError("the function has static shapes: plan it with tvm_roller.plan")
    backend = ctx.backend
    if backend.no_dynamic_kernels:
        raise UnsupportedError(f"symbolic shape: the {backend.name} backend builds no bucket "
                               f"kernels yet ({backend.no_dynamic_kernels})")
    spans, notes = _bounds_of(variables, bounds)
    # a model's buckets name all its variables: those of other functions (they have bounds)
    # are not this function's concern; a name nothing bounds is warned about
    buckets = {k: v for k, v in (buckets or {}).items() if k in variables or k not in
               (bounds or {})}
    grid = bucket_grid(variables, spans, buckets)
    cases: List[Case] = []
    for ends in itertools.product(*(grid[n] for n in variables)):
        ranges = []
        for name, end in zip(variables, ends):
            i = grid[name].index(end)
            lo = grid[name][i - 1] if i else spans[name][0] - 1
            last = i == len(grid[name]) - 1
            ranges.append((name, lo, None if last else end))
        at = dict(zip(variables, ends))
        cases.append(_case(func, tuple(ranges), at, ctx))
    if len(variables) == 1 and variables[0] not in (buckets or {}):
        cases = _refine(func, cases, ctx)
    cases = _merge_same(cases)
    return DynamicPlan(func, variables, tuple((n, *spans[n]) for n in variables),
                       tuple(cases), ctx, tuple(notes), time.perf_counter() - t0)


def _case(func, ranges, at: Dict[str, int], ctx: Context) -> Case:
    case = Case(tuple(ranges), tuple(at.items()), _plan_bucket(func, ranges, at, ctx))
    return dataclasses.replace(case, trace=_bucket_trace(func, case, ctx))


def _refine(func, cases: List[Case], ctx: Context) -> List[Case]:
    """Split the bucket whose kernel pads the most (its tile's ``bucket_waste``) in two, each
    half planned again, while any pads more than ``REFINE_WASTE`` and the function has
    fewer than ``MAX_BUCKETS`` (one shape variable: a bucket is a range of its values)."""
    cases = list(cases)
    while len(cases) < MAX_BUCKETS:
        def top(c: Case) -> int:
            return c.ranges[0][2] if c.ranges[0][2] is not None else dict(c.planned_at)[
                c.ranges[0][0]]
        splittable = [i for i, c in enumerate(cases) if top(c) - c.ranges[0][1] >= 2]
        if not splittable:
            break
        # the most extra time first: a small function's padding matters less
        i = max(splittable, key=lambda j: cases[j].plan.tiles[0].bucket_waste *
                cases[j].plan.predicted_s)
        case = cases[i]
        if case.plan.tiles[0].bucket_waste <= REFINE_WASTE:
            break
        name, lo, hi = case.ranges[0]
        mid = (lo + top(case)) // 2
        cases[i:i + 1] = [_case(func, ((name, lo, mid),), {name: mid}, ctx),
                          _case(func, ((name, mid, hi),), {name: top(case)}, ctx)]
    return cases


def _plan_bucket(func: tirx.PrimFunc, ranges, at: Dict[str, int], ctx: Context) -> Plan:
    """The plan at ``at``, its analysis told which axes follow a variable and their extents at
    the bucket's smallest values (the schedule cache keys the bucket's tiles by them)."""
    prep = prepare(symbolic.specialize(func, at), ctx, decompose=False)
    low = {name: lo + 1 for name, lo, _ in ranges}
    probe = low if low != at else {n: v + 1 for n, v in at.items()}
    fa_probe = _analysis_at(func, probe, ctx)
    axes = tuple(symbolic.dynamic_axes(prep.analysis.axes, fa_probe.axes))
    lows = tuple(fa_probe.axes[i].extent if probe is low else prep.analysis.axes[i].extent
                 for i in axes)
    fa = dataclasses.replace(prep.analysis, dynamic_axes=axes, dynamic_low=lows)
    return plan_prepared(dataclasses.replace(prep, analysis=fa))


def _merge_same(cases: List[Case]) -> List[Case]:
    """Consecutive buckets (along the last variable, the others equal) whose schedules are
    the same trace (the same kernel once replayed: a streaming function's tile names its
    extents, its trace does not): one case spanning both, the later one's plan."""
    out: List[Case] = []
    for case in cases:
        prev = out[-1] if out else None
        if prev is not None and prev.ranges[:-1] == case.ranges[:-1] and \
                str(prev.trace) == str(case.trace):
            name, lo, _ = prev.ranges[-1]
            merged = prev.ranges[:-1] + ((name, lo, case.ranges[-1][2]),)
            out[-1] = dataclasses.replace(case, ranges=merged)
        else:
            out.append(case)
    return out


def lower_dynamic(dp: DynamicPlan) -> tirx.PrimFunc:
    """The dispatching function: each case's kernel replayed on the symbolic function."""
    backend = dp.cases[0].plan.backend
    form = backend.scheduling_form(dp.func)
    kernels = []
    for case in dp.cases:
        sch = s_tir.Schedule(form)
        try:
            case.trace.apply_to_schedule(sch, remove_postproc=False)
        except (RuntimeError, ValueError, TypeError) as err:
            raise UnsupportedError(f"the kernel for {case.label()} does not replay on the "
                                   f"symbolic extents: {type(err).__name__}: "
                                   f"{first_lines(err, 240)}") from err
        _refuse_symbolic_partial_sums(sch, case)
        _partition_tails(sch)
        kernels.append(sch.mod["main"])
    conditions = [_condition(case, symbolic.shape_vars(dp.func)) for case in dp.cases]
    return symbolic.dispatch(dp.func, list(zip(conditions, kernels)))


def _refuse_symbolic_partial_sums(sch: s_tir.Schedule, case: Case) -> None:
    """A reduction over a symbolic extent split into partial sums (rfactor) sums past the end:
    TVM 0.27 drops the split's predicate (measured: a softmax 1% off at 300 keys). The
    representative sizes keep the lowering from it; this refuses any replayed kernel that
    still has one (a partial-sum block reducing over a symbolic extent), never a wrong one."""
    for name in block_names(sch):
        if name.endswith("_rf"):
            blk = sch.get(sch.get_sblock(name))
            if any(iv.iter_type == 2 and not isinstance(iv.dom.extent, tirx.IntImm)
                   for iv in blk.iter_vars):
                raise UnsupportedError(f"the kernel for {case.label()} splits a reduction "
                                       "over a symbolic extent into partial sums")


def _partition_tails(sch: s_tir.Schedule) -> None:
    """A vectorized loop under a loop of symbolic extent (a split of a dynamic axis, its tail
    predicated): the outer loop gets TVM's loop-partition hint, so the full vectors run in a
    loop of their own without the predicate (a predicated vector loop is scalarized;
    measured 2.4x on attention's scale-mask-softmax at 512 keys)."""
    done = set()
    for name in block_names(sch):
        loops = sch.get_loops(sch.get_sblock(name))
        for outer, inner in zip(loops, loops[1:]):
            node = sch.get(outer)
            if int(sch.get(inner).kind) == 2 and not isinstance(node.extent, tirx.IntImm) \
                    and node.loop_var.id_ not in done:
                sch.annotate(outer, "pragma_loop_partition_hint", 1)
                done.add(node.loop_var.id_)


def _analysis_at(func: tirx.PrimFunc, values: Dict[str, int], ctx: Context) -> FuncAnalysis:
    """The analysis of the static function at ``values`` of the shape variables."""
    return prepare(symbolic.specialize(func, values), ctx, decompose=False).analysis


def _bucket_trace(func: tirx.PrimFunc, case: Case, ctx: Context) -> s_tir.Trace:
    """The case's schedule, recorded with plain splits on the function at a representative of
    each planned value (:func:`representative`): no extent that follows a variable is then a
    multiple of a vector width or a task tile there, so the lowering takes no step that holds
    only for some values (a reduction's lanes vectorized through rfactor would read past a
    symbolic end: wrong sums, measured) and a padded axis really pads (``pad_einsum`` where
    nothing pads records nothing of the padding's own schedule)."""
    plan = case.plan
    fa, tile = plan.analysis, plan.tiles[0]
    at = {n: representative(v) for n, v in case.planned_at}
    while True:
        rep = fa if at == dict(case.planned_at) else _analysis_at(func, at, ctx)
        steps = [(rep.axes[i].extent, tile.l2[i] if rep.axes[i].kind == "S" else tile.l1[i])
                 for i in fa.dynamic_axes]
        if tile.kind != "tiled" or all(s == 1 or e % s for e, s in steps) or \
                all(v == 1 for v in at.values()):
            break
        at = {n: max(1, v - 1) for n, v in at.items()}  # a padded axis must pad (n = 2)
    if rep is not fa:
        plan = dataclasses.replace(plan, analysis=dataclasses.replace(
            rep, dynamic_axes=fa.dynamic_axes, dynamic_low=fa.dynamic_low))
    with plain_splits():
        lowered = lower(plan, plan.tiles[0], traceable=True)
    trace = lowered.schedule.trace
    if trace is None:
        raise UnsupportedError(f"the kernel for {case.label()} has no trace to replay")
    return trace


def representative(value: int) -> int:
    """The largest prime at most ``value`` that is not one less than a multiple of 8 (an axis
    of ``n + 1`` would divide a vector width): ``value`` itself up to 2, where nothing
    splits."""
    for p in range(value, 2, -1):
        if (p + 1) % 8 and p % 8 and all(p % d for d in range(2, int(p ** 0.5) + 1)):
            return p
    return value


def _condition(case: Case, variables: Dict[str, tirx.Var]) -> Optional[tirx.PrimExpr]:
    """``v <= hi`` for each bounded variable of the case (None: no test, the last one)."""
    terms = [variables[name] <= tirx.IntImm(str(variables[name].ty.dtype), hi)
             for name, _, hi in case.ranges if hi is not None]
    if not terms:
        return None
    cond = terms[0]
    for t in terms[1:]:
        cond = tirx.And(cond, t)
    return cond


def describe(dp: DynamicPlan) -> List[str]:
    """Lines for ``explain``: the variables, their buckets and each bucket's tile."""
    lines = ["shape variables: " + ", ".join(f"{n} in {lo}..{hi}" for n, lo, hi in dp.bounds)]
    lines += [f"  note: {n}" for n in dp.notes]
    lines.append(f"{len(dp.cases)} kernel(s), dispatched on the values at run time; "
                 f"construction {dp.construct_s * 1e3:.1f} ms")
    for case in dp.cases:
        t = case.plan.tiles[0]
        padded = [case.plan.analysis.axes[i].name for i in case.plan.analysis.dynamic_axes]
        lines.append(f"  {case.label()}: planned at {dict(case.planned_at)}, {t.kind} "
                     f"reg {t.reg} task {t.l2}, {t.num_tasks} tasks, predicted "
                     f"{t.predicted_s * 1e6:.1f} us at that size"
                     + (f"; padded to the task tile: {', '.join(padded)}" if padded else ""))
    return lines
