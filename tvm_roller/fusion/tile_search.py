"""The search for a problem's best loop order and tiles under a capacity: a grid over the tile
ladders of every order, evaluated with numpy, then coordinate descent from the best orders."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Sequence, Tuple

import numpy as np

from tvm_roller.fusion.problem import (Problem, evaluate, footprints, memory_use, multipliers,
                                       parallel_tasks, trip_counts)
from tvm_roller.fusion.tile_sizes import MAX_PADDING_WASTE, tile_candidates

_GRID_BUDGET = 1_500_000  # tile combinations x orders evaluated per search before thinning
_MIN_GRID = 4096


@dataclass
class SearchResult:
    """The best order and tiles found, with their movement per tensor, MU, tasks and score."""

    order: Tuple[str, ...]
    tiles: Dict[str, int]
    dm: Dict[str, int]
    mu: int
    tasks: int
    score: float


def search_tiles(p: Problem, capacity: float, score: Callable[..., Any],
                 max_waste: float = MAX_PADDING_WASTE) -> SearchResult:
    """Best order and tiles of ``p`` under ``MU <= capacity``; ``score(dv, tasks, tiles, mu)``
    (arrays; ``tiles`` maps every loop to its tile sizes) is minimised. A grid over the
    (thinned) ladders for every order, then coordinate descent over the full ladders from the
    best three orders."""
    orders = p.orders() or [()]
    tiled = p.tiled_loops()
    full = {}
    for d in tiled:
        e, a = p.extents[d], p.align.get(d, 1)
        full[d] = [c for c in tile_candidates(e, max_waste) if c % a == 0 or c == e]
    cands = {d: list(v) for d, v in full.items()}
    budget = max(_MIN_GRID, _GRID_BUDGET // len(orders))
    while math.prod(len(v) for v in cands.values()) > budget:
        d = max(cands, key=lambda x: len(cands[x]))
        v = cands[d]
        if len(v) <= 2:
            break
        cands[d] = v[::2] if v[-1] in v[::2] else v[::2] + [v[-1]]  # keep the full extent
    fixed = {d: p.extents[d] for d in p.extents if d not in cands}

    def _grid(values: Dict[str, Sequence[int]]) -> Dict[str, np.ndarray]:
        if not tiled:
            return {d: np.array([v], dtype=np.int64) for d, v in fixed.items()}
        grids = np.meshgrid(*[np.asarray(values[d], dtype=np.int64) for d in tiled],
                            indexing="ij")
        out = {d: g.ravel() for d, g in zip(tiled, grids)}
        n = out[tiled[0]].shape
        out.update({d: np.full(n, v, dtype=np.int64) for d, v in fixed.items()})
        return out

    def _scores(order, tiles, df, trips, mu):
        mults = multipliers(p, order, trips)
        dv = np.zeros(mu.shape)
        for i, t in enumerate(p.tensors):
            if not t.free:
                dv = dv + df[i] * mults[i]
        tasks = parallel_tasks(p, order, trips) + np.zeros(mu.shape, dtype=np.int64)
        return np.asarray(score(dv, tasks, tiles, mu), dtype=np.float64) + np.zeros(mu.shape)

    tiles = _grid(cands)
    df = footprints(p, tiles)
    mu = np.asarray(memory_use(p, df))
    min_mu = float(mu.min())
    limit = capacity if min_mu <= capacity else min_mu  # nothing fits: the smallest blocks
    ok = mu <= limit
    tiles = {d: v[ok] for d, v in tiles.items()}
    df, mu = [np.asarray(f)[ok] for f in df], mu[ok]
    trips = trip_counts(p, tiles)
    ranked = []
    for order in orders:
        s = _scores(order, tiles, df, trips, mu)
        i = int(np.argmin(s))
        ranked.append((float(s[i]), order, {d: int(tiles[d][i]) for d in tiles}))
    ranked.sort(key=lambda r: r[0])

    best = None
    for s0, order, pt in ranked[:3]:
        cur, cur_s = dict(pt), s0
        for _ in range(8):
            improved = False
            for d in tiled:
                vals = np.asarray(full[d], dtype=np.int64)
                trial = {k: (vals if k == d else np.full(vals.shape, v, dtype=np.int64))
                         for k, v in cur.items()}
                tdf = footprints(p, trial)
                tmu = np.asarray(memory_use(p, tdf))
                s = _scores(order, trial, tdf, trip_counts(p, trial), tmu)
                s = np.where(tmu <= limit, s, np.inf)
                i = int(np.argmin(s))
                if s[i] < cur_s * (1 - 1e-9):
                    cur, cur_s, improved = {**cur, d: int(vals[i])}, float(s[i]), True
            if not improved:
                break
        if best is None or cur_s < best[0]:
            best = (cur_s, order, cur)
    s_best, order, pt = best
    dm, m, tk = evaluate(p, order, pt)
    return SearchResult(tuple(order), {d: int(v) for d, v in pt.items()},
                        {t.name: int(v) for t, v in zip(p.tensors, dm)}, int(m), int(tk), s_best)
