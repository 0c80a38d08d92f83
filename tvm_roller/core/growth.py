"""ROLLER's scale-up step: grow a tile along the axis with the best data-reuse score.

S_i = (Q(T) - Q(T'_i)) / (F(T'_i) - F(T)): Q is the traffic into the memory level, F the tile's
footprint in it, T'_i the tile with axis i enlarged to its next aligned size. Backend-neutral:
each backend's policy supplies the aligned steps, Q, F and what fits.
"""
from __future__ import annotations

from typing import Callable, List, Tuple

Tile = Tuple[int, ...]


def grow_by_reuse(start: Tile, steps: List[List[int]], cost_q: Callable[[Tile], float],
                  cost_f: Callable[[Tile], float], fits: Callable[[Tile], bool]) -> List[Tile]:
    """Greedy scale-up by reuse score; returns the path of eligible tiles (start first)."""
    path = [start]
    cur = start
    while True:
        q0, f0 = cost_q(cur), cost_f(cur)
        best, best_score = None, None
        for i, cand_sizes in enumerate(steps):
            bigger = [s for s in cand_sizes if s > cur[i]]
            if not bigger:
                continue
            nxt = list(cur)
            nxt[i] = bigger[0]
            nxt = tuple(nxt)
            if not fits(nxt):
                continue
            dq = q0 - cost_q(nxt)
            df = cost_f(nxt) - f0
            score = dq / df if df > 0 else (float("inf") if dq > 0 else 0.0)
            if dq <= 0 and score <= 0:
                continue
            key = (score, -i)  # ties: the earlier axis, deterministically
            if best_score is None or key > best_score:
                best, best_score = nxt, key
        if best is None:
            return path
        cur = best
        path.append(cur)
