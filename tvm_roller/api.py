"""The planner: plan, apply, schedule, build and explain, for any backend.

``plan`` analyses a function, picks its backend (``backends.registry``) and the first op rule
that takes it, constructs the ranked rTiles (or validates given ones: the schedule cache's hits
come through here too) and, for a GEMM chain, the backend's fusion decision. ``apply`` lowers a
tile through the same rule. No backend is named here.

A function an analysis-layer rewrite turns into independent parts (``analysis.parts``: a
transposed convolution as one sub-convolution per output parity, ``analysis.parity``) is
planned part by part here, in one place: ``prepare`` cuts the rewritten function into one
PrimFunc per part (each analysed and given its rule), ``plan_prepared`` plans every part,
``lower`` lowers each and stitches the scheduled bodies back into one function, ``explain``
shows each part's plan. ``build``, ``schedule``, the schedule cache, Relax and dlight all go
through these.
"""
from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import tvm
from tvm import s_tir, tirx

from tvm_roller.analysis import FuncAnalysis, parity
from tvm_roller.analysis.parts import Decomposition
from tvm_roller.analysis.schedule import block_names
from tvm_roller.backends.base import Backend, InvalidTile, OpRule
from tvm_roller.backends.registry import backend_for, has_backend
from tvm_roller.core.errors import FallbackWarning, UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.core.types import TargetLike
from tvm_roller.fusion import split
from tvm_roller.fusion.chain import GemmChain, detect_chain
from tvm_roller.fusion.decision import ChainDecision
from tvm_roller.hardware import DeviceModel, normalize_target, target_completion_notes

logger = logging.getLogger("tvm_roller")

# The rewrites that turn a function into independent parts, tried in turn (analysis layer).
_DECOMPOSERS = (parity.decompose,)


@dataclass(frozen=True)
class Decomposed:
    """A function rewritten into parts: the whole function's analysis, the rewrite, one
    PrimFunc per part (``fusion.split``: a buffer one part writes and a later one reads is a
    parameter of both) and the lead part (the heaviest: the plan's analysis, rule and tiles
    are its)."""

    whole: FuncAnalysis
    decomposition: Decomposition
    funcs: Tuple[tirx.PrimFunc, ...]
    lead: int = 0


@dataclass(frozen=True)
class Prepared:
    """A function analysed for a target: what planning starts from (and the cache keys on).
    A decomposed function holds its parts, each prepared; its ``analysis`` and ``rule`` are
    then the lead part's (the whole function's analysis: ``decomposed.whole``)."""

    analysis: FuncAnalysis
    target: tvm.target.Target
    device: DeviceModel
    backend: Backend
    rule: OpRule
    target_notes: Tuple[str, ...]
    started: float  # perf_counter() when preparation began
    parts: Tuple["Prepared", ...] = ()
    decomposed: Optional[Decomposed] = None


@dataclass(frozen=True)
class Plan:
    """What roller constructed for one function: the analysis, the ranked rTiles, the target,
    and for a chain of two matmuls its fusion decision. Immutable."""

    analysis: FuncAnalysis
    target: tvm.target.Target
    device: DeviceModel
    tiles: Tuple[RTile, ...]
    backend: Backend
    rule: OpRule
    target_notes: Tuple[str, ...] = ()
    construct_s: float = 0.0
    chain: Optional[GemmChain] = None
    fusion: Optional[ChainDecision] = None
    from_cache: bool = False  # the tiles were read back from the schedule cache (every part's)
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


@dataclass(frozen=True)
class Lowered:
    """A tile applied: the schedule, and the chain decision it realised (a fused kernel that
    refused the chain turns the decision to "operators one by one")."""

    schedule: s_tir.Schedule
    fusion: Optional[ChainDecision] = None


def pass_context(target: tvm.target.Target) -> tvm.transform.PassContext:
    """The PassContext a roller schedule for ``target`` is compiled under."""
    return tvm.transform.PassContext(opt_level=3, config=dict(backend_for(target).pass_config))


def resolve_target(target: TargetLike, device: Optional[DeviceModel] = None):
    """Normalise the target (complete an llvm target from the host) and get its device model:
    (target, device, notes)."""
    tgt = normalize_target(target)
    backend = backend_for(tgt)
    notes = target_completion_notes(target)
    dev = device if device is not None else backend.device_model(tgt)
    notes += backend.check_device(tgt, dev)
    return tgt, dev, notes


def prepare(func, target: TargetLike, device: Optional[DeviceModel] = None) -> Prepared:
    """Analyse ``func`` for ``target`` and pick the rule that schedules it (UnsupportedError
    when none does). A function a rewrite turns into independent parts (``_DECOMPOSERS``) is
    prepared part by part; when a part cannot be, the function is prepared whole."""
    t0 = time.perf_counter()
    tgt, dev, notes = resolve_target(target, device)
    return _prepare(func, tgt, dev, tuple(notes), t0)


def _prepare(func, tgt: tvm.target.Target, dev: DeviceModel, notes: Tuple[str, ...],
             t0: float, decompose: bool = True) -> Prepared:
    backend = backend_for(tgt)
    fa = backend.analyze(func)
    dec = _decompose(fa, backend, dev) if decompose else None
    if dec is not None:
        try:
            parts = tuple(_prepare(f, tgt, dev, notes, t0, decompose=False) for f in dec.funcs)
        except UnsupportedError as err:
            # planned whole, as before the rewrite; the plan's notes (explain, reports) say why
            reason = f"{fa.main}: {dec.decomposition.kind} decomposition not planned by parts " \
                     f"({err}): planned whole"
            logger.info("tvm_roller: %s", reason)
            notes = notes + (reason,)
        else:
            lead = max(range(len(parts)), key=lambda i: (parts[i].analysis.flops, -i))
            dec = Decomposed(fa, dec.decomposition, dec.funcs, lead)
            return Prepared(parts[lead].analysis, tgt, dev, backend, parts[lead].rule, notes, t0,
                            parts, dec)
    return Prepared(fa, tgt, dev, backend, backend.rule_for(fa), notes, t0)


def _decompose(fa: FuncAnalysis, backend: Backend, dev: DeviceModel) -> Optional[Decomposed]:
    """The first rewrite of ``fa``'s function into parts, cut into one PrimFunc per part (the
    rewrite is told the device's vector width, to lay out what it creates)."""
    if not backend.decomposes:
        return None
    for rewrite in _DECOMPOSERS:
        dec = rewrite(fa.func, vector_lanes=dev.simd_lanes(fa.dtype))
        if dec is not None:
            funcs, _ = split.split_groups(dec.func, [list(g) for g in dec.groups])
            logger.info("tvm_roller: %s %s", fa.main, dec.reason)
            return Decomposed(fa, dec, tuple(funcs))
    return None


def plan_prepared(prep: Prepared, topk: int = 1,
                  tiles: Optional[Sequence[RTile]] = None) -> Plan:
    """The plan of a prepared function: its rule constructs the top-k rTiles, or, given
    ``tiles`` (e.g. read from a cache), checks each through the rule (``InvalidTile`` when one
    does not fit) and uses them. A chain of two matmuls also gets its fusion decision. A
    decomposed function plans each part (:func:`plan_parts`; tiles are given per part)."""
    if prep.parts:
        if tiles is not None:
            raise InvalidTile("a function decomposed into parts takes tiles per part")
        return plan_parts(prep, [plan_prepared(part, topk) for part in prep.parts])
    fa, dev, rule = prep.analysis, prep.device, prep.rule
    if tiles is None:
        tiles = _feasible(rule.construct(fa, dev, topk), fa, rule, dev)
        from_cache = False
    else:
        for t in tiles:
            rule.validate(t, fa, dev)
        from_cache = True
    chain, fusion = _plan_chain(fa, prep.backend, dev)
    return Plan(fa, prep.target, dev, tuple(tiles), prep.backend, rule, prep.target_notes,
                time.perf_counter() - prep.started, chain, fusion, from_cache)


def plan_parts(prep: Prepared, parts: Sequence[Plan]) -> Plan:
    """The plan of a decomposed function from its parts' plans (one per ``prep.parts``)."""
    if len(parts) != len(prep.parts) or not prep.decomposed:
        raise ValueError("one plan per part of a decomposed function")
    lead = parts[prep.decomposed.lead]
    return Plan(lead.analysis, prep.target, prep.device, lead.tiles, prep.backend, lead.rule,
                prep.target_notes, time.perf_counter() - prep.started,
                from_cache=all(p.from_cache for p in parts), parts=tuple(parts),
                decomposed=prep.decomposed)


def _feasible(tiles: Sequence[RTile], fa: FuncAnalysis, rule: OpRule,
              dev: DeviceModel) -> List[RTile]:
    """The candidates the device can run: a plan none of whose tiles fits (predicted to take
    forever: too many threads, too much shared memory, no occupancy) is a decline, never a
    built kernel."""
    ok = [t for t in tiles if math.isfinite(t.predicted_s)]
    if not ok:
        why = ", ".join(sorted({t.bound for t in tiles})) or "no candidate"
        raise UnsupportedError(f"no {rule.name} tile of {fa.main} fits {dev.name} (bound by "
                               f"{why})")
    return ok


def plan(func, target: TargetLike, topk: int = 1, device: Optional[DeviceModel] = None) -> Plan:
    """Analyse ``func`` and construct its top-k rTiles (no TVM scheduling yet)."""
    return plan_prepared(prepare(func, target, device), topk)


def _plan_chain(fa: FuncAnalysis, backend: Backend, dev: DeviceModel
                ) -> Tuple[Optional[GemmChain], Optional[ChainDecision]]:
    """A chain of two matmuls (Chimera): the backend's decision whether fusing pays. Functions
    with fewer than two reduction blocks skip the detection's own schedule."""
    rule = backend.chain_rule
    if rule is None or sum(b.is_reduction for b in fa.blocks) < 2:
        return None, None
    chain = detect_chain(fa.func)
    if chain is None:
        return None, None
    decision = rule.plan(chain, dev)
    logger.info("tvm_roller: GEMM chain %s -> %s: %s (%s)", chain.first, chain.second,
                "fused" if decision.fuse else "not fused", decision.reason)
    return chain, decision


def lower(p: Plan, tile: RTile, traceable: bool = False) -> Lowered:
    """``tile`` applied to the planned function through its rule. A chain roller does not fuse
    is built as its operators one by one, each with roller's own schedule for it alone; that
    result is IR, not a trace, so ``traceable=True`` (MetaSchedule records) asks the chain rule
    for a one-function schedule of the operators in turn instead."""
    if p.parts:
        return Lowered(_lower_parts(p, tile, traceable))
    func = p.analysis.func
    if p.chain is None:
        return Lowered(p.rule.lower(func, p.analysis, tile, p.device))
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
                                       lambda part: _schedule_alone(part, p.target, p.device)),
                   decision)


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
            return _schedule_alone(part_func, p.target, p.device)
        part = p.parts[i]
        return lower(part, tile if i == dec.lead else part.tiles[0]).schedule

    # the rewritten function has the original's parameters and attributes
    return split.build_groups(dec.decomposition.func,
                              [list(g) for g in dec.decomposition.groups], one)


def apply(p: Plan, tile: RTile, traceable: bool = False) -> s_tir.Schedule:
    """``tile`` applied to the planned function (see :func:`lower`)."""
    return lower(p, tile, traceable).schedule


def _schedule_alone(func, target: tvm.target.Target, device: DeviceModel) -> s_tir.Schedule:
    p = plan(func, target, 1, device)
    return apply(p, p.tiles[0])


def schedule(func, target: TargetLike, topk: int = 1, device: Optional[DeviceModel] = None):
    """A ``tvm.s_tir.Schedule`` built from roller's best rTile; a list of the top-k if topk > 1."""
    p = plan(func, target, topk, device)
    schs = [apply(p, t) for t in p.tiles]
    return schs[0] if topk == 1 else schs


def build(func, target: TargetLike, fallback: bool = False, device: Optional[DeviceModel] = None):
    """Schedule with roller and compile; what ``tvm.compile`` returns.

    With ``fallback=True`` a function roller cannot handle is built with TVM's default
    lowering (dlight's rules on a GPU), and a :class:`FallbackWarning` gives the reason.
    """
    try:
        p = plan(func, target, 1, device)
        sch = apply(p, p.tiles[0])
        with pass_context(p.target):
            return tvm.compile(sch.mod, target=p.target)
    except UnsupportedError as err:
        # TVM's default build can't help with a non-function input or an invalid target either
        if not fallback or not isinstance(func, (tvm.IRModule, tirx.PrimFunc)):
            raise
        tgt = normalize_target(target)  # raises UnsupportedError for an invalid target
        warnings.warn(f"roller declined ({err}); building with TVM's default schedule",
                      FallbackWarning, stacklevel=2)
        mod = func if isinstance(func, tvm.IRModule) else tvm.IRModule({"main": func})
        return tvm.compile(default_schedule(mod, tgt), target=tgt)


def default_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """TVM's own default treatment of ``mod`` for ``target``: unscheduled on a CPU, dlight's
    default rules on a GPU (what roller's results are compared with, and the fallback for what
    roller declines). A target roller has no backend for gets TVM's own build, unchanged."""
    if not has_backend(target):
        return mod
    return backend_for(target).default_schedule(mod, target)


def explain(func, target: TargetLike, device: Optional[DeviceModel] = None, topk: int = 3) -> str:
    """Human-readable account of the construction: rTiles per level, alignment, prediction; a
    function planned as parts, why, and each part's plan."""
    p = plan(func, target, topk, device)
    lines = [f"target: {p.target}"]
    lines += [f"  note: {n}" for n in p.target_notes]
    lines.append(p.backend.describe_device(p.device))
    if not p.parts:
        return "\n".join(lines + plan_lines(p))
    fa, dec = p.decomposed.whole, p.decomposed
    lines.append(f"main block: {fa.main}, dtype {fa.dtype}, {fa.flops / 1e6:.2f} MFLOP as "
                 "written")
    lines.append(f"{dec.decomposition.reason}")
    lines += [f"  note: {n}" for n in dec.decomposition.notes]
    flops = sum(part.analysis.flops for part in p.parts if part.analysis.kind != "elementwise")
    lines.append(f"{len(p.parts)} parts, planned one by one and stitched into one function "
                 f"({flops / 1e6:.2f} MFLOP of reductions left); predicted "
                 f"{p.predicted_s * 1e6:.1f} us in all; construction {p.construct_s * 1e3:.1f} ms")
    for i, (part, label) in enumerate(zip(p.parts, dec.decomposition.labels)):
        lead = " (lead: the plan's candidates are its tiles)" if i == dec.lead else ""
        lines.append(f"part {i + 1}/{len(p.parts)}: {label}{lead}")
        lines += ["  " + line for line in plan_lines(part, construction=False,
                                                      candidates=None if lead else 1)]
    return "\n".join(lines)


def plan_lines(p: Plan, construction: bool = True,
                candidates: Optional[int] = None) -> List[str]:
    fa, best = p.analysis, p.tiles[0]
    lines = [f"main block: {fa.main} ({best.kind}, rule {p.rule.name}), dtype {fa.dtype}, "
             f"{fa.flops / 1e6:.2f} MFLOP"]
    lines.append("axes: " + ", ".join(f"{a.name}={a.extent}{a.kind}" for a in fa.axes))
    if fa.vector_axis is not None:
        lines.append(f"vector axis: {fa.axes[fa.vector_axis].name}")
    if construction:
        lines.append(f"construction: {p.construct_s * 1e3:.1f} ms, {len(p.tiles)} candidate(s)")
    for rank, t in enumerate(p.tiles[:candidates]):
        lines.append(f"#{rank + 1}: predicted {t.predicted_s * 1e6:.1f} us, bound by {t.bound}, "
                     f"{t.num_tasks} parallel tasks")
        lines += p.rule.describe(t)
        lines.append("    terms (s): " + ", ".join(f"{k}={v:.3g}" for k, v in t.terms.items()))
    lines += [f"alignment: {n}" for n in best.notes]
    if p.chain is not None:
        lines += _describe_chain(p.chain, p.fusion)
    return lines


def _describe_chain(chain: GemmChain, d: ChainDecision) -> List[str]:
    mid = " -> ".join(chain.between) if chain.between else "nothing"
    return [f"GEMM chain: {chain.first} ({chain.m}x{chain.k} . {chain.k}x{chain.l}) -> {mid} -> "
            f"{chain.second} (. {chain.l}x{chain.n}), batch {chain.batch or [1]}; intermediate "
            f"{chain.intermediate_bytes / 2**20:.2f} MiB",
            f"decision: {'fused' if d.fuse else 'not fused (operators one by one)'}: {d.reason}",
            *d.lines]
