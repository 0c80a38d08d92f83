"""The public functions: ``plan``, ``schedule``, ``build`` and ``explain``, for static functions
and functions with symbolic extents alike (``tvm_roller.plan`` and so on).

Each makes the call's :class:`Context` (the target normalised once; a Context given as the
target is used as it is) and goes through the one
planner: ``prepare`` / ``plan_prepared`` / ``lower``, the bucket planner for symbolic extents,
and ``schedule_function``'s one fallback path. ``cache``: a
:class:`~tvm_roller.cache.ScheduleCache` to take tiles from and store them in (default: none).
"""
from __future__ import annotations

import warnings
from typing import Mapping, Optional, Sequence

import tvm
from tvm import tirx

from tvm_roller.analysis import symbolic
from tvm_roller.cache.schedules import ScheduleCache
from tvm_roller.core.errors import FallbackWarning, UnsupportedError
from tvm_roller.core.inputs import unwrap_func
from tvm_roller.core.types import TargetLike
from tvm_roller.hardware import DeviceModel, complete_target
from tvm_roller.planner.buckets import Bounds, plan_dynamic
from tvm_roller.planner.context import Context, context_for
from tvm_roller.planner.explain import explain_dynamic, explain_plan
from tvm_roller.planner.lower import apply
from tvm_roller.planner.plan import Plan, plan_prepared
from tvm_roller.planner.prepare import prepare
from tvm_roller.planner.scheduling import ScheduleOptions, Scheduled, default_schedule, \
    schedule_function

Buckets = Optional[Mapping[str, Sequence[int]]]


def plan(func, target: TargetLike, topk: int = 1, device: Optional[DeviceModel] = None,
         cache: Optional[ScheduleCache] = None) -> Plan:
    """Analyse ``func`` and construct its top-k rTiles (no TVM scheduling yet)."""
    return plan_prepared(prepare(func, _context(target, device, cache)), topk)


def schedule(func, target: TargetLike, topk: int = 1, device: Optional[DeviceModel] = None,
             cache: Optional[ScheduleCache] = None):
    """A ``tvm.s_tir.Schedule`` built from roller's best rTile; a list of the top-k if topk > 1."""
    p = plan(func, target, topk, device, cache)
    schs = [apply(p, t) for t in p.tiles]
    return schs[0] if topk == 1 else schs


def build(func, target: TargetLike, fallback: bool = False,
          device: Optional[DeviceModel] = None, bounds: Optional[Bounds] = None,
          buckets: Buckets = None, cache: Optional[ScheduleCache] = None,
          verify: bool = False):
    """Schedule with roller and compile; what ``tvm.compile`` returns. A function with symbolic
    extents is planned per bucket of its shape variables (``bounds``: variable -> (lower,
    upper); ``buckets``: variable -> bucket upper ends) and compiled once for every value.
    ``verify``: run roller's kernel once against TVM's default build of the function on random
    inputs (``planner.verify``): a mismatch is a roller error (``WrongResultError``).

    With ``fallback=True`` a function roller declines or fails on is built as its operators
    one by one when it has several, else with TVM's default lowering (dlight's rules on a
    GPU), and a :class:`FallbackWarning` gives the reason; without, the reason is raised.
    """
    given = isinstance(target, Context)
    # UnsupportedError for an invalid target; the target is normalised here, the one time
    tgt, notes = (target.target, ()) if given else complete_target(target)
    try:
        ctx = _context(target, device, cache) if given else \
            Context.for_target(tgt, notes, device, cache)
        prim = unwrap_func(func)
    except UnsupportedError as err:
        # no backend or device model for the target, or a module of several functions: TVM's
        # default builds it whole; anything else is no function at all
        if not (fallback and isinstance(func, (tvm.IRModule, tirx.PrimFunc))):
            raise
        _warn_fallback(f"roller declined ({err}); building with TVM's default schedule")
        mod = func if isinstance(func, tvm.IRModule) else tvm.IRModule({"main": func})
        return tvm.compile(default_schedule(mod, tgt), target=tgt)
    res = schedule_function(prim, ctx, options=ScheduleOptions(bounds, buckets, verify=verify))
    if res.error is not None:
        if not fallback:
            raise res.error
        _warn_fallback(_fallback_message(res))
    if res.kernel is not None:
        return res.executable
    return tvm.compile(default_schedule(tvm.IRModule({"main": prim}), ctx.target),
                       target=ctx.target)


def _fallback_message(res: Scheduled) -> str:
    what = "declined" if isinstance(res.error, UnsupportedError) else "failed on it"
    if res.kernel is not None:  # built as its operators: the entry says how
        return f"roller {what}: {res.entry.reason}"
    return f"roller {what} ({res.entry.reason}); building with TVM's default schedule"


def _warn_fallback(message: str) -> None:
    warnings.warn(message, FallbackWarning, stacklevel=3)


def explain(func, target: TargetLike, device: Optional[DeviceModel] = None, topk: int = 3,
            bounds: Optional[Bounds] = None, buckets: Buckets = None,
            cache: Optional[ScheduleCache] = None) -> str:
    """Human-readable account of the construction: rTiles per level, alignment, prediction; a
    function planned as parts, why, and each part's plan; a function with symbolic extents,
    its buckets, each bucket's tile and the largest bucket's plan in full."""
    ctx = _context(target, device, cache)
    prim = _one_prim_func(func)
    if prim is not None and symbolic.is_symbolic(prim):
        return explain_dynamic(plan_dynamic(prim, ctx, bounds, buckets))
    return explain_plan(plan_prepared(prepare(func, ctx), topk))


def _one_prim_func(func):
    """The PrimFunc of ``func`` (itself, or a module's only function); None otherwise (the
    static planner then says what is wrong with it)."""
    try:
        return unwrap_func(func)
    except UnsupportedError:
        return None


def _context(target, device: Optional[DeviceModel], cache: Optional[ScheduleCache]) -> Context:
    """The call's context: ``target`` normalised, or a Context taken as it is (``cache`` set
    when given)."""
    return context_for(target, device, **({} if cache is None else {"cache": cache}))
