"""Top-k measured (ROLLER's own headline numbers are top-10 measured): a function's top-k
candidates built and timed on this machine, the fastest kept.

Opt-in (``Context.measure``, ``relax.compile(measure_topk=k)``): each candidate is lowered,
built and timed in isolation on random arguments (``planner.inputs``) until the function's
time budget is spent; the winner is stored in the schedule cache under its own key (a measured
entry), so it is paid once per function and machine.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Sequence, Tuple

import tvm
from tvm import s_tir

from tvm_roller.core.rtile import RTile
from tvm_roller.planner.context import Context
from tvm_roller.planner.inputs import random_arguments


@dataclass(frozen=True)
class Measured:
    """The candidates in measured order (the fastest first), each one's seconds and its rank
    by the micro-model's prediction."""

    tiles: Tuple[RTile, ...]
    seconds: Tuple[float, ...]
    predicted_rank: Tuple[int, ...]

    def describe(self) -> str:
        return (f"measured {len(self.tiles)} candidates: predicted #{self.predicted_rank[0] + 1} "
                f"fastest ({self.seconds[0] * 1e6:.1f} us; predicted best "
                f"{self.seconds[self.predicted_rank.index(0)] * 1e6:.1f} us)")


def measure_candidates(tiles: Sequence[RTile], schedule_of: Callable[[RTile], s_tir.Schedule],
                       ctx: Context, budget_s: float) -> Measured:
    """``tiles`` (best predicted first) built and timed in turn within ``budget_s`` (the first
    always), then sorted by time; a candidate that fails to build or run is dropped."""
    start = time.perf_counter()
    timed: List[Tuple[float, int, RTile]] = []
    for rank, tile in enumerate(tiles):
        if rank and time.perf_counter() - start > budget_s:
            break
        try:
            seconds = _time(schedule_of(tile), ctx)
        except (RuntimeError, ValueError, TypeError, IndexError):  # TVM refused this one
            continue
        timed.append((seconds, rank, tile))
    if not timed:  # none built: the predicted order stands (the caller meets the error)
        return Measured(tuple(tiles), tuple(float("inf") for _ in tiles),
                        tuple(range(len(tiles))))
    timed.sort(key=lambda x: (x[0], x[1]))
    return Measured(tuple(t for _, _, t in timed), tuple(s for s, _, _ in timed),
                    tuple(r for _, r, _ in timed))


def _time(sch: s_tir.Schedule, ctx: Context) -> float:
    func = sch.mod["main"].with_attr("global_symbol", "main")
    with ctx.pass_context():
        ex = tvm.compile(tvm.IRModule({"main": func}), target=ctx.target)
    dev = tvm.cpu()
    # a scalar parameter (None) takes 1: it is a value, never an extent (``analysis.func``)
    args = [1 if a is None else tvm.runtime.tensor(a, dev) for a in random_arguments(func)]
    timer = ex.mod.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=10)
    return float(timer(*args).median)
