"""Plans: the ranked rTiles of a prepared function, from its rule or from the schedule cache.

``plan_prepared`` is the one place a function is planned. It goes part by part through a
decomposed function (the only recursion over parts). For each function it asks the context's
schedule cache first: a hit's tiles are checked by the function's rule (a tile that does not
fit is discarded from the cache and the function planned afresh); a miss is constructed by the
rule and stored. A bucket of a function with symbolic extents is looked up under its bucket
(which axes follow a shape variable and their smallest extents). A chain of two matmuls also
gets the backend's fusion decision (Chimera).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.backends.base import OpRule
from tvm_roller.cache.schedules import EntryKey, ScheduleCache
from tvm_roller.core.errors import CacheWarning, InvalidTile, UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.fusion.chain import GemmChain, detect_chain
from tvm_roller.fusion.decision import ChainDecision
from tvm_roller.planner.context import Context, InContext
from tvm_roller.planner.prepare import Decomposed, Prepared

logger = logging.getLogger("tvm_roller")


@dataclass(frozen=True)
class Plan(InContext):
    """What roller constructed for one function: the analysis, the ranked rTiles, the context,
    and for a chain of two matmuls its fusion decision. Immutable."""

    analysis: FuncAnalysis
    ctx: Context
    tiles: Tuple[RTile, ...]
    rule: OpRule
    target_notes: Tuple[str, ...] = ()
    construct_s: float = 0.0
    chain: Optional[GemmChain] = None
    fusion: Optional[ChainDecision] = None
    from_cache: bool = False  # the tiles were read back from the schedule cache (every part's)
    cache_key: Optional[EntryKey] = None  # the entry the tiles were looked up under
    # a function rewritten into independent parts: each part's plan, and how it was rewritten.
    # ``analysis``, ``rule`` and ``tiles`` are then the lead part's (``decomposed.lead``; the
    # whole function's analysis is ``decomposed.whole``); the other parts are lowered with
    # their best tile
    parts: Tuple["Plan", ...] = ()
    decomposed: Optional[Decomposed] = None

    @property
    def predicted_s(self) -> float:
        """The best tile's predicted latency (a decomposed function: the sum over its parts)."""
        if self.parts:
            return sum(p.predicted_s for p in self.parts)
        return self.tiles[0].predicted_s

    def cached_leaves(self) -> List["Plan"]:
        """The plans (this one, or its parts) whose tiles came from the cache."""
        return [p for p in (self.parts or (self,)) if p.from_cache]


def plan_prepared(prep: Prepared, topk: int = 1, tiles: Optional[Sequence[RTile]] = None,
                  fresh: bool = False) -> Plan:
    """The plan of a prepared function: its top-k rTiles from the cache or its rule (see the
    module doc), or, given ``tiles``, those, each checked through the rule (``InvalidTile``
    when one does not fit). ``fresh``: plan afresh without looking in the cache (and store).
    A decomposed function plans each part."""
    if prep.parts:
        if tiles is not None:
            raise InvalidTile("a function decomposed into parts takes tiles per part")
        return plan_parts(prep, [plan_prepared(part, topk, fresh=fresh) for part in prep.parts])
    fa, ctx, rule = prep.analysis, prep.ctx, prep.rule
    key = None
    if tiles is not None:
        for t in tiles:
            rule.validate(t, fa, ctx.device)
        from_cache = True
    else:
        tiles, from_cache, key = _tiles(prep, topk, fresh)
    chain, fusion = _plan_chain(fa, ctx)
    return Plan(fa, ctx, tuple(tiles), rule, prep.notes, time.perf_counter() - prep.started,
                chain, fusion, from_cache, key)


def plan_parts(prep: Prepared, parts: Sequence[Plan]) -> Plan:
    """The plan of a decomposed function from its parts' plans (one per ``prep.parts``)."""
    if len(parts) != len(prep.parts) or not prep.decomposed:
        raise ValueError("one plan per part of a decomposed function")
    lead = parts[prep.decomposed.lead]
    return Plan(lead.analysis, prep.ctx, lead.tiles, lead.rule, prep.notes,
                time.perf_counter() - prep.started,
                from_cache=all(p.from_cache for p in parts), parts=tuple(parts),
                decomposed=prep.decomposed)


def _tiles(prep: Prepared, topk: int, fresh: bool
           ) -> Tuple[List[RTile], bool, Optional[EntryKey]]:
    """(tiles, from the cache, the cache key) of one function."""
    fa, ctx, rule = prep.analysis, prep.ctx, prep.rule
    cache = ctx.cache
    if cache is None:
        return _construct(prep, topk), False, None
    key = cache.entry_key(fa.func, ctx.target, ctx.device, bucket_material(fa))
    if not fresh:
        hit = cache.lookup(key, topk)
        if hit is not None:
            names = [a.name for a in fa.axes]  # names are not in the hash: this function's
            hit = [dataclasses.replace(t, axes=list(names)) for t in hit]
            try:
                for t in hit:
                    rule.validate(t, fa, ctx.device)
                return hit, True, key
            except InvalidTile as err:
                cache.discard(key, f"tile does not fit the function: {err}")
    tiles = _construct(prep, topk)
    _store(prep, key, tiles, topk)
    return tiles, False, key


def bucket_material(fa: FuncAnalysis) -> Optional[Dict[str, Any]]:
    """What a bucket's tiles were weighed against beyond the function (None: static)."""
    if not fa.dynamic_axes:
        return None
    return {"dynamic_axes": list(fa.dynamic_axes), "dynamic_low": list(fa.dynamic_low)}


def _store(prep: Prepared, key: EntryKey, tiles: List[RTile], topk: int) -> None:
    cache = prep.ctx.cache
    try:
        for t in tiles:
            prep.rule.validate(t, prep.analysis, prep.ctx.device)
    except InvalidTile as err:
        # a fresh tile the cache would reject on reading: don't store it (and don't warn the
        # user each compile); the plan itself is used as is
        logger.debug("not caching the plan of %s: %s", key.digest, err)
        return
    store_tiles(cache, key, tiles, topk)


def store_tiles(cache: ScheduleCache, key: EntryKey, tiles: Sequence[RTile], topk: int) -> None:
    """Store ``tiles`` under ``key``; a cache that cannot be written is warned about once per
    entry, and planning goes on without it."""
    try:
        cache.store(key, list(tiles), topk)
    except OSError as err:
        warnings.warn(f"cannot write the schedule cache in {cache.directory} ({err}); "
                      "continuing without it", CacheWarning, stacklevel=5)


def _construct(prep: Prepared, topk: int) -> List[RTile]:
    """The rule's top-k tiles the device can run: a plan none of whose tiles fits (predicted
    to take forever: too many threads, too much shared memory, no occupancy) is a decline,
    never a built kernel."""
    fa, dev, rule = prep.analysis, prep.ctx.device, prep.rule
    tiles = rule.construct(fa, dev, topk)
    ok = [t for t in tiles if math.isfinite(t.predicted_s)]
    if not ok:
        why = ", ".join(sorted({t.bound for t in tiles})) or "no candidate"
        raise UnsupportedError(f"no {rule.name} tile of {fa.main} fits {dev.name} (bound by "
                               f"{why})")
    return ok


def _plan_chain(fa: FuncAnalysis, ctx: Context
                ) -> Tuple[Optional[GemmChain], Optional[ChainDecision]]:
    """A chain of two matmuls (Chimera): the backend's decision whether fusing pays. Functions
    with fewer than two reduction blocks skip the detection's own schedule."""
    rule = ctx.backend.chain_rule
    if rule is None or sum(b.is_reduction for b in fa.blocks) < 2:
        return None, None
    chain = detect_chain(fa.func)
    if chain is None:
        return None, None
    decision = rule.plan(chain, ctx.device)
    logger.info("tvm_roller: GEMM chain %s -> %s: %s (%s)", chain.first, chain.second,
                "fused" if decision.fuse else "not fused", decision.reason)
    return chain, decision
