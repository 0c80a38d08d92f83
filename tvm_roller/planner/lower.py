"""Plans lowered to schedules: a tile applied through its rule, a chain roller does not fuse
built as its operators, a decomposed function's parts stitched back into one function.

``plan_and_lower`` is what scheduling one function means everywhere (the public functions,
Relax, dlight): plan it, lower the best tile, and when a tile that came from the schedule cache
fails to apply, drop that entry and plan afresh.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional

from tvm import s_tir, tirx

from tvm_roller.analysis.schedule import block_names
from tvm_roller.core.errors import InvalidTile, UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.fusion import split
from tvm_roller.fusion.decision import ChainDecision
from tvm_roller.planner.context import Context
from tvm_roller.planner.measure import measure_candidates
from tvm_roller.planner.plan import Plan, bucket_material, plan_prepared, store_tiles
from tvm_roller.planner.prepare import Prepared, prepare

logger = logging.getLogger("tvm_roller")

# What applying an unsuitable tile raises: TVM 0.27 has no common TVMError base; FFI errors
# arrive as RuntimeError subclasses (ScheduleError, InternalError) or ValueError/TypeError/
# IndexError, and backends/cpu/lower.py's own index arithmetic raises the rest.
APPLY_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, KeyError, ZeroDivisionError)


@dataclass(frozen=True)
class Lowered:
    """A tile applied: the schedule, and the chain decision it realised (a fused kernel that
    refused the chain turns the decision to "operators one by one")."""

    schedule: s_tir.Schedule
    fusion: Optional[ChainDecision] = None


@dataclass(frozen=True)
class PlannedSchedule:
    """A function planned and its best tile lowered; ``from_cache``: its tiles (every part's)
    came from the schedule cache; ``measured``: how top-k measured chose it ("" unmeasured)."""

    plan: Plan
    lowered: Lowered
    from_cache: bool
    measured: str = ""

    @property
    def schedule(self) -> s_tir.Schedule:
        return self.lowered.schedule


def lower(p: Plan, tile: RTile, traceable: bool = False) -> Lowered:
    """``tile`` applied to the planned function through its rule. A chain roller does not fuse
    is built as its operators one by one, each with roller's own schedule for it alone; that
    result is IR, not a trace, so ``traceable=True`` (MetaSchedule records) asks the chain rule
    for a one-function schedule of the operators in turn instead."""
    if p.parts:
        return Lowered(_lower_parts(p, tile, traceable))
    func = p.analysis.func
    if p.chain is None:
        return Lowered(p.rule.lower(func, p.analysis, tile, p.device, traceable))
    decision = p.fusion
    if decision.fuse or traceable:
        try:
            return Lowered(p.backend.chain_rule.lower(func, p.chain, decision, p.device),
                           decision)
        except UnsupportedError as err:  # e.g. stages a row block cannot pass through
            if traceable or not decision.fuse:
                raise
            decision = decision.refused(f"the fused kernel refused it ({err}): operators one "
                                        "by one")
            logger.warning("tvm_roller: %s", decision.reason)
    return Lowered(split.build_unfused(func, p.chain,
                                       lambda part: schedule_alone(part, p.ctx)), decision)


def apply(p: Plan, tile: RTile, traceable: bool = False) -> s_tir.Schedule:
    """``tile`` applied to the planned function (see :func:`lower`)."""
    return lower(p, tile, traceable).schedule


def _lower_parts(p: Plan, tile: RTile, traceable: bool) -> s_tir.Schedule:
    """Each part lowered (the lead with ``tile``, the others with their best tile) and the
    scheduled bodies stitched in order into the function (``fusion.split``: a part reading
    another's output has its CUDA fetches made synchronous); the result is IR, not a trace."""
    if traceable:
        raise UnsupportedError(f"{p.decomposed.whole.main} is planned as {len(p.parts)} parts "
                               f"({p.decomposed.decomposition.kind} decomposition): no "
                               "one-function trace of it")
    dec = p.decomposed
    by_blocks = {tuple(block_names(s_tir.Schedule(f))): i for i, f in enumerate(dec.funcs)}

    def one(part_func: tirx.PrimFunc) -> s_tir.Schedule:
        i = by_blocks.get(tuple(block_names(s_tir.Schedule(part_func))))
        if i is None:  # a part split further after a refusal: planned on its own
            return schedule_alone(part_func, p.ctx)
        part = p.parts[i]
        return lower(part, tile if i == dec.lead else part.tiles[0]).schedule

    # the rewritten function has the original's parameters and attributes
    return split.build_groups(dec.decomposition.func,
                              [list(g) for g in dec.decomposition.groups], one)


def schedule_alone(func, ctx: Context) -> s_tir.Schedule:
    """Roller's schedule of one operator on its own (a chain's or a decomposed function's)."""
    return plan_and_lower(func, ctx).schedule


def plan_and_lower(func, ctx: Context) -> PlannedSchedule:
    """Plan ``func`` (through the context's cache) and apply its best tile (with
    ``ctx.measure``: the fastest of its top-k on this machine). A tile from the cache that fails
    to apply (written by a lowering that has since changed) is warned about, its entry dropped,
    and the function planned afresh and stored."""
    prep = prepare(func, ctx)
    if ctx.measure is not None and not prep.parts:
        measured = _measured(prep, ctx)
        if measured is not None:
            return measured
    p = plan_prepared(prep, 1)
    cached = p.cached_leaves()
    if not cached:
        return PlannedSchedule(p, lower(p, p.tiles[0]), False)
    try:
        return PlannedSchedule(p, lower(p, p.tiles[0]), p.from_cache)
    except APPLY_ERRORS as err:
        for leaf in cached:
            ctx.cache.discard(leaf.cache_key, f"cached tile failed to apply: "
                                              f"{type(err).__name__}: {err}")
    p = plan_prepared(prepare(func, ctx), 1, fresh=True)
    return PlannedSchedule(p, lower(p, p.tiles[0]), False)


def _measured(prep: Prepared, ctx: Context) -> Optional[PlannedSchedule]:
    """The fastest of the function's top-k, from the cache's measured entry or measured now
    (and stored); None for a plan with nothing to choose (one candidate, a matmul chain)."""
    m, fa, cache = ctx.measure, prep.analysis, ctx.cache
    key = None if cache is None else cache.entry_key(
        fa.func, ctx.target, ctx.device, {"measured": m.topk, "bucket": bucket_material(fa)})
    hit = None if key is None else cache.lookup(key, 1)
    if hit is not None:
        tile = dataclasses.replace(hit[0], axes=[a.name for a in fa.axes])
        try:
            p = plan_prepared(prep, 1, tiles=[tile])
        except InvalidTile as err:
            cache.discard(key, f"tile does not fit the function: {err}")
        else:
            if p.chain is None:
                return PlannedSchedule(p, lower(p, p.tiles[0]), True, "measured before")
    p = plan_prepared(prep, m.topk)
    if p.chain is not None or len(p.tiles) < 2:
        return None
    result = measure_candidates(p.tiles, lambda t: lower(p, t).schedule, ctx, m.budget_s)
    p = dataclasses.replace(p, tiles=result.tiles)
    if key is not None:
        store_tiles(cache, key, p.tiles[:1], 1)
    return PlannedSchedule(p, lower(p, p.tiles[0]), False, result.describe())
