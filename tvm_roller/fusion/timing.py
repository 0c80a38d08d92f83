"""The predicted time of one nest: per-term times (movement into each level, compute) with
parallelism and wave quantisation, and the search for the nest's best (or least-traffic) plan."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from tvm_roller.fusion.inner_tiling import InnerTiling, inner_info
from tvm_roller.fusion.levels import Levels, core_bandwidth
from tvm_roller.fusion.problem import Problem
from tvm_roller.fusion.tile_search import SearchResult, search_tiles

_TRAFFIC_WEIGHT = 0.1  # search objective: largest term + this x the sum of the movement terms


class NestTimer:
    """Per-term times (seconds) of one nest: the volume into the tile level from ``outer``, the
    volume into the inner level (from the tile level), the compulsory DRAM volume when ``outer``
    is not DRAM, and (optionally) compute; all with parallelism and wave quantisation."""

    def __init__(self, dev, lv: Levels, outer: int, compulsory: float, flops: float,
                 dtype: str, include_compute: bool, inner: Sequence[Optional[InnerTiling]],
                 extents: Dict[str, int]):
        self.dev, self.lv, self.outer = dev, lv, outer
        self.compulsory, self.flops = compulsory, flops
        self.inner, self.extents = [i for i in inner if i is not None], extents
        self.peak = dev.peak_per_unit(dtype) * 1e9
        self.include_compute = include_compute
        names = [x.name for x in dev.levels]
        self.key_tile = f"{names[lv.tile]}<-{names[outer]}"
        self.key_inner = (f"{names[lv.inner]}<-{names[lv.tile]}"
                          if lv.inner is not None and self.inner else None)
        self.key_dram = f"{names[outer]}<-{names[-1]}" if outer != len(names) - 1 else None

    def _frac(self, tasks):
        tasks = np.maximum(np.asarray(tasks, dtype=np.float64), 1.0)
        cores = max(1, self.dev.num_units)
        return np.ceil(tasks / cores) / tasks, np.minimum(tasks, cores)

    def compute(self, tasks) -> Any:
        frac, _ = self._frac(tasks)
        return self.flops * frac / self.peak

    def inner_volume(self, tiles: Dict[str, Any]) -> Any:
        return sum(i.volume(self.extents, tiles) for i in self.inner) if self.inner else 0

    def terms(self, dv_tile, tasks, dv_inner) -> Dict[str, Any]:
        frac, busy = self._frac(tasks)
        t = {self.key_tile: dv_tile * frac / core_bandwidth(self.dev, self.outer, busy)}
        if self.key_inner:
            t[self.key_inner] = dv_inner * frac / core_bandwidth(self.dev, self.lv.tile, busy)
        if self.key_dram:
            last = len(self.dev.levels) - 1
            t[self.key_dram] = self.compulsory * frac / core_bandwidth(self.dev, last, busy)
        if self.include_compute:
            t["compute"] = self.flops * frac / self.peak
        return t

    def score(self, dv_tile, tasks, tiles, mu):
        t = self.terms(dv_tile, tasks, self.inner_volume(tiles))
        vals = list(t.values())
        worst = vals[0]
        for v in vals[1:]:
            worst = np.maximum(worst, v)
        # among near-equal times prefer less traffic: a tenth of every movement term is added
        moved = 0
        for k, v in t.items():
            if k != "compute":
                moved = moved + v
        return worst + _TRAFFIC_WEIGHT * moved


def _least_volume(dv, tasks, tiles, mu):
    return dv - 1e-6 * mu  # Chimera's objective; among equal volumes the largest blocks


@dataclass
class Nest:
    """One nest's plan: the search's result, its tiles, inner tilings, per-term times, volumes."""

    best: SearchResult
    tiles: Dict[str, int]
    inner: List[Dict[str, Any]]
    terms: Dict[str, float]
    levels: Dict[str, int]
    compute_s: float

    @property
    def volume(self) -> int:
        return int(sum(self.best.dm.values()))

    @property
    def time_s(self) -> float:
        return max(self.terms.values())

    @property
    def bound(self) -> str:
        return max(self.terms, key=self.terms.get)


def run_nest(p: Problem, cap: float, timer: NestTimer, loops: Sequence[str],
             objective: str = "time") -> Nest:
    """The nest's plan for ``objective`` (least time, else least volume), with its times."""
    best = search_tiles(p, cap, timer.score if objective == "time" else _least_volume)
    ext = timer.extents
    tiles = {d: int(best.tiles.get(d, ext[d])) for d in loops}
    full = {**ext, **tiles}
    inner = [inner_info(i, ext, full) for i in timer.inner]
    v_in = sum(i["volume"] for i in inner)
    terms = {k: float(v) for k, v in timer.terms(float(sum(best.dm.values())),
                                                 best.tasks, v_in).items()}
    levels = {timer.key_tile: int(sum(best.dm.values()))}
    if timer.key_inner:
        levels[timer.key_inner] = int(v_in)
    if timer.key_dram:
        levels[timer.key_dram] = int(timer.compulsory)
    return Nest(best, tiles, inner, terms, levels, float(timer.compute(best.tasks)))
