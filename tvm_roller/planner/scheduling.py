"""Scheduling one function, with the one decline / error / un-group / fallback path.

``schedule_function`` is what every integration calls for each function (``build``, the Relax
pipeline, dlight; MetaSchedule calls ``schedule_candidates``, the same path for its top-k
traceable schedules): it returns roller's kernel (or None: leave the function to TVM's default) and
the function's report entry. It never raises for a failure inside roller: a function roller
declines (``UnsupportedError``: a reason) or fails on (any other error: a defect, reported with
its type and message) is left to TVM's default, except one holding several operators (a matmul
chain roller grouped), which is retried as those operators one by one, each scheduled through
this same function. The caller decides what a failure means for it (``build`` raises it unless
``fallback=True``, dlight hands the function to the next rule, Relax keeps TVM's default).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Optional, Tuple

import tvm
from tvm import s_tir, tirx

from tvm_roller.analysis import symbolic
from tvm_roller.analysis.kernel_facts import kernel_facts
from tvm_roller.analysis.size import tree_size
from tvm_roller.backends.registry import backend_for, has_backend
from tvm_roller.core.errors import UnsupportedError, WrongResultError, first_lines
from tvm_roller.fusion import split
from tvm_roller.planner.buckets import lower_dynamic, plan_dynamic
from tvm_roller.planner.context import Context
from tvm_roller.planner.lower import APPLY_ERRORS, lower, plan_and_lower
from tvm_roller.planner.plan import plan_prepared
from tvm_roller.planner.prepare import prepare
from tvm_roller.planner.report import FuncReport
from tvm_roller.planner.roofline import Bound, bound, bound_of
from tvm_roller.planner.verify import verify

logger = logging.getLogger("tvm_roller")


@dataclass(frozen=True)
class ScheduleOptions:
    """How a function with symbolic extents is bucketed: the shape variables' bounds (name ->
    (lower, upper)) and the user's bucket ends (name -> sizes; None: powers of two).
    ``symbolic=False``: such a function goes the static way and is declined there (the dlight
    rule, which knows no bounds for its shape variables)."""

    bounds: Optional[dict] = None
    buckets: Optional[dict] = None
    symbolic: bool = True
    # the wrong-result guard: each kernel run once against TVM's default build of the
    # function (``planner.verify``); a mismatch is an error and the function falls back
    verify: bool = False


@dataclass(frozen=True)
class Scheduled:
    """One function's outcome: roller's kernel (marked scheduled; None: TVM's default builds the
    function), its report entry, the exception that made roller decline or fail (None when all
    went through roller), and with ``check`` the kernel's own build."""

    kernel: Optional[tirx.PrimFunc]
    entry: FuncReport
    error: Optional[BaseException] = None
    executable: Optional[tvm.runtime.Executable] = None


def schedule_function(func: tirx.PrimFunc, ctx: Context, name: str = "main",
                      options: Optional[ScheduleOptions] = None,
                      check: bool = True) -> Scheduled:
    """Roller's kernel of ``func`` and its report entry (see the module doc). ``check``: build
    the kernel alone now, so a schedule TVM cannot lower or compile fails here, for this
    function alone (and is reported), not later in a whole model's build."""
    options = options or ScheduleOptions()
    try:
        _check_size(func)  # (analysing it would walk the same tree)
        kernel, entry = _kernel(name, func, ctx, options)
        _check_size(kernel)
        entry.facts = _facts(kernel, ctx)
        kernel = kernel.with_attr("tirx.is_scheduled", True)
        res = Scheduled(kernel, entry, None, _build(kernel, ctx) if check else None)
        if options.verify and res.executable is not None:
            _verified(func, res, ctx)
    except UnsupportedError as err:
        res = _fallback(name, func, ctx, options, check, "decline", str(err), err)
    except Exception as err:  # noqa: BLE001  (reported as a roller error, never swallowed)
        reason = f"{type(err).__name__}: {first_lines(err)}"
        logger.warning("tvm_roller: error scheduling %s, left to TVM's default: %s", name, reason)
        res = _fallback(name, func, ctx, options, check, "error", reason, err)
    if res.entry.bound_s is None:  # left to TVM's default, or built as its operators
        _set_bound(res.entry, bound_of(func, ctx))
    return res


@dataclass(frozen=True)
class Candidate:
    """One traceable schedule of a function (a MetaSchedule record): its rank among the planned
    tiles and the micro-model's predicted time."""

    rank: int
    schedule: s_tir.Schedule
    predicted_s: float


@dataclass(frozen=True)
class Candidates:
    """A function's top-k traceable schedules, best first (empty when roller declined or failed:
    ``error`` says why), the ranks that gave no trace replaying on the function (rank, reason),
    and the function's report entry."""

    schedules: Tuple[Candidate, ...]
    entry: FuncReport
    failed: Tuple[Tuple[int, str], ...] = ()
    error: Optional[BaseException] = None


def schedule_candidates(func: tirx.PrimFunc, ctx: Context, name: str = "main",
                        topk: int = 1) -> Candidates:
    """The top-k schedules of ``func`` as traces (what MetaSchedule records hold), through the
    one path: the size check, the plan, each tile lowered ``traceable`` and its trace replayed
    on ``func`` (a database replays every record when loaded), the report entry. A matmul chain
    roller does not fuse is un-grouped into one trace of its operators in turn (``lower``); a
    function roller declines or fails on gets the fallback entry, never an exception."""
    try:
        _check_size(func)
        # a record is one trace of the function itself: planned whole, never as parts
        # stitched together (``analysis.parts``)
        p = plan_prepared(prepare(func, ctx, decompose=False), topk)
        found: List[Candidate] = []
        failed: List[Tuple[int, str]] = []
        for rank, tile in enumerate(p.tiles):
            try:
                sch = lower(p, tile, traceable=True).schedule
                _check_size(sch.mod["main"])
                s_tir.Trace.apply_json_to_schedule(sch.trace.as_json(), s_tir.Schedule(func))
            except (UnsupportedError,) + APPLY_ERRORS as err:
                failed.append((rank, f"{type(err).__name__}: {first_lines(err)}"))
                continue
            found.append(Candidate(rank, sch, tile.predicted_s))
        if not found:
            raise UnsupportedError(f"none of the {len(p.tiles)} planned tiles gives a trace that "
                                   f"replays: {failed[0][1]}")
        top = p.tiles[found[0].rank]
        fusion = "" if p.fusion is None else \
            f"{'fused' if p.fusion.fuse else 'unfused'}: {p.fusion.reason}"
        entry = FuncReport(name, "roller", top.kind, top.to_dict(), top.predicted_s,
                           cached=p.from_cache, fusion=fusion)
        entry.facts = _facts(found[0].schedule.mod["main"], ctx)
        _set_bound(entry, bound(p.decomposed.whole if p.decomposed else p.analysis, ctx.device))
        return Candidates(tuple(found), entry, tuple(failed))
    except UnsupportedError as err:
        entry, error = FuncReport(name, "fallback", reason=str(err), fallback="decline"), err
    except Exception as err:  # noqa: BLE001  (reported as a roller error, never swallowed)
        reason = f"{type(err).__name__}: {first_lines(err)}"
        logger.warning("tvm_roller: error planning %s's candidates: %s", name, reason)
        entry, error = FuncReport(name, "fallback", reason=reason, fallback="error"), err
    _set_bound(entry, bound_of(func, ctx))
    return Candidates((), entry, (), error)


def _kernel(name: str, func: tirx.PrimFunc, ctx: Context, options: ScheduleOptions
            ) -> Tuple[tirx.PrimFunc, FuncReport]:
    """The kernel: one per bucket dispatched at run time for symbolic extents, else the best
    tile's schedule (both planned through the context's cache)."""
    if options.symbolic and symbolic.is_symbolic(func):
        dp = plan_dynamic(func, ctx, bounds=options.bounds, buckets=options.buckets)
        top = dp.cases[-1].plan.tiles[0]
        entry = FuncReport(name, "roller", dp.kind, top.to_dict(), top.predicted_s,
                           cached=dp.from_cache, buckets=dp.buckets())
        _set_bound(entry, bound(dp.cases[-1].plan.analysis, ctx.device))
        return lower_dynamic(dp), entry
    ps = plan_and_lower(func, ctx)
    decision = ps.lowered.fusion
    fusion = "" if decision is None else \
        f"{'fused' if decision.fuse else 'unfused'}: {decision.reason}"
    tile = ps.plan.tiles[0]
    entry = FuncReport(name, "roller", tile.kind, tile.to_dict(), tile.predicted_s,
                       cached=ps.from_cache, fusion=fusion, measured=ps.measured)
    whole = ps.plan.decomposed.whole if ps.plan.decomposed else ps.plan.analysis
    _set_bound(entry, bound(whole, ctx.device))
    return ps.schedule.mod["main"], entry


#: a kernel with more expression nodes than this is declined before it is compiled: code
#: generation walks each use of a shared subexpression, so compile time follows this count
#: (roller's own kernels stay under a few thousand; ``analysis.schedule.INLINE_NODES``)
MAX_KERNEL_NODES = 100_000


def _check_size(kernel: tirx.PrimFunc) -> None:
    nodes = tree_size(kernel.body, MAX_KERNEL_NODES + 1)
    if nodes > MAX_KERNEL_NODES:
        raise UnsupportedError(f"the kernel's expressions hold over {MAX_KERNEL_NODES} nodes: "
                               "compiling it would take minutes")


def _verified(func: tirx.PrimFunc, res: Scheduled, ctx: Context) -> None:
    """Roller's build of ``func`` checked against TVM's default (WrongResultError if not)."""
    verdict = verify(func, res.executable, ctx)
    res.entry.verified = verdict.detail
    if not verdict.ok:
        raise WrongResultError(verdict.detail)


def _facts(kernel: tirx.PrimFunc, ctx: Context) -> dict:
    """The kernel's loop-nest facts, with its arithmetic at the device's peak (``arith_s``: a
    second lower bound, for the elementwise work the roofline leaves out)."""
    facts = kernel_facts(kernel).to_dict()
    peak = ctx.device.peak_gflops.get("float32", 0.0)
    facts["arith_s"] = facts["arith_ops"] / (peak * 1e9) if peak else None
    return facts


def _set_bound(entry: FuncReport, b: Optional[Bound]) -> None:
    if b is not None:
        entry.bound_s, entry.bound_by = b.seconds, b.by


def _build(kernel: tirx.PrimFunc, ctx: Context) -> tvm.runtime.Executable:
    """The kernel built alone (a Relax module's private PrimFuncs have no symbol: "main")."""
    if kernel.attrs is None or "global_symbol" not in kernel.attrs:
        kernel = kernel.with_attr("global_symbol", "main")
    with ctx.pass_context():
        return tvm.compile(tvm.IRModule({"main": kernel}), target=ctx.target)


def _fallback(name: str, func: tirx.PrimFunc, ctx: Context, options: ScheduleOptions,
              check: bool, fallback: str, reason: str, err: BaseException) -> Scheduled:
    """The one fallback: ``func``'s operators one by one when it has several (a chain group
    that cannot be fused or planned whole is un-grouped this way), else TVM's default."""
    whole = Scheduled(None, FuncReport(name, "fallback", reason=reason, fallback=fallback), err)
    try:
        groups = split.reduction_groups(func)
    except UnsupportedError:
        return whole
    if len(groups) < 2:
        return whole
    parts: List[Tuple[str, str]] = []  # (fallback kind, reason) of each part left to TVM
    scheduled = []

    def one(part: tirx.PrimFunc) -> s_tir.Schedule:
        res = schedule_function(part, ctx, f"{name}/part", options, check)
        if res.kernel is None:
            parts.append((res.entry.fallback, res.entry.reason))
            return s_tir.Schedule(default_schedule(tvm.IRModule({"main": part}),
                                                   ctx.target)["main"])
        scheduled.append(part)
        return s_tir.Schedule(res.kernel)

    try:
        kernel = split.build_groups(func, groups, one).mod["main"].with_attr(
            "tirx.is_scheduled", True)
        executable = _build(kernel, ctx) if check else None
    except Exception as split_err:  # noqa: BLE001  (the whole function's reason is reported)
        whole.entry.reason += f"; as its operators: {type(split_err).__name__}: " \
                              f"{first_lines(split_err)}"
        return whole
    if not scheduled:  # every operator left to TVM's default: so is the whole function
        return whole
    worst = "error" if fallback == "error" or any(k == "error" for k, _ in parts) else \
        ("decline" if parts else "")
    detail = f"{reason}; built as its {len(groups)} operators one by one"
    if parts:
        detail += f" ({len(parts)} left to TVM's default: " + \
            "; ".join(r for _, r in parts) + ")"
    return Scheduled(kernel, FuncReport(name, "roller", "operators", reason=detail,
                                        fallback=worst), err, executable)


def default_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """TVM's own default treatment of ``mod`` for a normalised ``target``: unscheduled on a CPU,
    dlight's default rules on a GPU (what roller's results are compared with, and the fallback
    for what roller declines). A target roller has no backend for gets TVM's own build."""
    if not has_backend(target):
        return mod
    return backend_for(target).default_schedule(mod, target)


def is_scheduled(func: tirx.PrimFunc) -> bool:
    """Marked done by a schedule rule or pass (``tirx.is_scheduled``): left alone."""
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))
