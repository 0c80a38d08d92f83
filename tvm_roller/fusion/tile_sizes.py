"""The tile sizes the data-movement model tries for one loop: divisors and near-divisors of its
extent, about two per octave."""
from __future__ import annotations

import math
from typing import List

MAX_PADDING_WASTE = 0.10


def _divisors(e: int) -> List[int]:
    out = []
    i = 1
    while i * i <= e:
        if e % i == 0:
            out += [i, e // i]
        i += 1
    return sorted(set(out))


def _waste(e: int, t: int) -> float:
    return (math.ceil(e / t) * t - e) / e


def tile_candidates(extent: int, max_waste: float = MAX_PADDING_WASTE) -> List[int]:
    """Tile sizes for one loop: divisors and near-divisors (padding waste <= ``max_waste``) of
    ``extent``, about two per octave (near 1, 2, 3, 4, 6, 8, 12, 16, ...), plus the extent."""
    e = int(extent)
    if e <= 1:
        return [1]
    divs = _divisors(e)
    ladder = sorted({(1 << i) for i in range(e.bit_length() + 1)} |
                    {3 * (1 << i) for i in range(e.bit_length())})
    ladder = [v for v in ladder if v <= e]
    chosen = {e}
    for v in ladder:
        near = [d for d in divs if abs(math.log(d / v)) <= math.log(1.5)]
        if near:  # an exact divisor near the ladder point
            chosen.add(min(near, key=lambda d: (abs(math.log(d / v)), -d)))
            continue
        # a near-divisor: the ladder size itself, else the balanced split into ceil(e/v) tiles
        for t in (v, math.ceil(e / math.ceil(e / v))):
            if _waste(e, t) <= max_waste + 1e-12:
                chosen.add(t)
                break
    return sorted(chosen)
