"""A function analysed for a context: what planning starts from.

``prepare`` analyses the function with the backend's rules and picks the first rule that takes
it. A function an analysis-layer rewrite turns into independent parts (``analysis.parts``: a
transposed convolution as one sub-convolution per output parity, ``analysis.parity``; a
product's vector axis as its whole vectors and its tail, ``analysis.vector_tail``; a
convolution's prime output width as a head and a tail, ``analysis.window_tail``) is cut
into one PrimFunc per part here, each prepared on its own; the plan, the lowering and the
schedule cache then go part by part (``planner.plan``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional, Tuple

from tvm import tirx

from tvm_roller.analysis import FuncAnalysis, parity, vector_tail, window_tail
from tvm_roller.analysis.parts import Decomposition
from tvm_roller.backends.base import OpRule
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.fusion import split
from tvm_roller.planner.context import Context

logger = logging.getLogger("tvm_roller")

# The rewrites that turn a function into independent parts, tried in turn (analysis layer);
# the tail splits only for a backend that asks for them (``Backend.splits_tails``).
_DECOMPOSERS = (parity.decompose,)
_TAIL_SPLITS = (vector_tail.decompose, window_tail.decompose)


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
    """A function analysed for a context. A decomposed function holds its parts, each
    prepared; its ``analysis`` and ``rule`` are then the lead part's (the whole function's
    analysis: ``decomposed.whole``)."""

    analysis: FuncAnalysis
    ctx: Context
    rule: OpRule
    started: float  # perf_counter() when preparation began
    parts: Tuple["Prepared", ...] = ()
    decomposed: Optional[Decomposed] = None
    notes: Tuple[str, ...] = ()  # the context's notes and why a decomposition was not used


def prepare(func, ctx: Context, decompose: bool = True) -> Prepared:
    """Analyse ``func`` for ``ctx`` and pick the rule that schedules it (UnsupportedError when
    none does). A function a rewrite turns into independent parts (``_DECOMPOSERS``) is
    prepared part by part; when a part cannot be, the function is prepared whole."""
    return _prepare(func, ctx, ctx.notes, time.perf_counter(), decompose)


def _prepare(func, ctx: Context, notes: Tuple[str, ...], t0: float,
             decompose: bool) -> Prepared:
    fa = ctx.backend.analyze(func)
    dec = _decompose(fa, ctx) if decompose else None
    if dec is not None:
        try:
            parts = tuple(_prepare(f, ctx, notes, t0, decompose=False) for f in dec.funcs)
        except UnsupportedError as err:
            # planned whole, as before the rewrite; the plan's notes (explain, reports) say why
            reason = f"{fa.main}: {dec.decomposition.kind} decomposition not planned by parts " \
                     f"({err}): planned whole"
            logger.info("tvm_roller: %s", reason)
            notes = notes + (reason,)
        else:
            lead = max(range(len(parts)), key=lambda i: (parts[i].analysis.flops, -i))
            dec = Decomposed(fa, dec.decomposition, dec.funcs, lead)
            return Prepared(parts[lead].analysis, ctx, parts[lead].rule, t0, parts, dec, notes)
    return Prepared(fa, ctx, ctx.backend.rule_for(fa), t0, notes=notes)


def _decompose(fa: FuncAnalysis, ctx: Context) -> Optional[Decomposed]:
    """The first rewrite of ``fa``'s function into parts, cut into one PrimFunc per part (the
    rewrite is told the device's vector width, to lay out what it creates)."""
    if not ctx.backend.decomposes:
        return None
    rewrites = _DECOMPOSERS + (_TAIL_SPLITS if ctx.backend.splits_tails else ())
    for rewrite in rewrites:
        dec = rewrite(fa.func, vector_lanes=ctx.device.simd_lanes(fa.dtype))
        if dec is not None:
            funcs, _ = split.split_groups(dec.func, [list(g) for g in dec.groups])
            logger.info("tvm_roller: %s %s", fa.main, dec.reason)
            return Decomposed(fa, dec, tuple(funcs))
    return None
