"""Each op's tiling for the level inside the tile level (L1 on a CPU), chosen once over the full
extents (least volume, bottom-up as in ROLLER) and clamped to a tile-level block."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tvm_roller.fusion.chain_spec import Chain, Op
from tvm_roller.fusion.levels import Levels
from tvm_roller.fusion.problem import build_problem
from tvm_roller.fusion.tile_search import search_tiles


@dataclass
class InnerTiling:
    """One op's tiling for the inner level (L1), chosen once over the full extents (least
    volume); inside a block of the tile level it is clamped to the block."""

    op: Op
    level: str
    order: Tuple[str, ...]
    tiles: Dict[str, int]
    tensors: List[Tuple[Tuple[str, ...], int]]  # (loops, elem_bytes) of the op's tensors

    def volume(self, ext: Dict[str, int], block: Dict[str, Any]) -> Any:
        """Bytes moved into the inner level over the whole op when it runs in blocks of
        ``block`` (ints or arrays): number of blocks x the model's volume of one block."""
        loops = self.op.loops
        sub = {d: np.minimum(self.tiles.get(d, 1), block[d]) for d in loops}
        sub_trips = {d: -(-np.asarray(block[d]) // sub[d]) for d in loops}
        blocks = 1
        for d in loops:
            blocks = blocks * -(-ext[d] // np.asarray(block[d]))
        total = 0
        for tloops, elem in self.tensors:
            df = elem
            for d in tloops:
                df = df * sub[d]
            mult, met = 1, False
            for d in reversed(self.order):
                if d in tloops:
                    met = True
                if met:
                    mult = mult * sub_trips[d]
            total = total + df * mult
        return blocks * total


def plan_inner_tiling(chain: Chain, dev, lv: Levels, op: Op) -> Optional[InnerTiling]:
    """``op``'s least-volume tiling for the inner level; None without an inner level."""
    if lv.inner is None:
        return None
    inner = dev.levels[lv.inner]
    p = build_problem(chain, [op], chain.extents(), [], inner.line_bytes)
    # least volume; among equals the largest tiles (fewer blocks, longer inner loops)
    best = search_tiles(p, lv.usable(dev, lv.inner), lambda dv, tasks, tiles, mu: dv - 1e-6 * mu)
    return InnerTiling(op, inner.name, best.order, {d: best.tiles[d] for d in op.loops},
                       [(chain.tensor(tn).loops, chain.tensor(tn).elem_bytes)
                        for tn in op.tensors])


def inner_info(inner: InnerTiling, ext: Dict[str, int], block: Dict[str, int]) -> Dict[str, Any]:
    """The inner tiling inside blocks of ``block``, as plain data for a plan."""
    return {"op": inner.op.name, "level": inner.level, "order": list(inner.order),
            "tiles": {d: int(min(inner.tiles[d], block[d])) for d in inner.op.loops},
            "blocks": int(math.prod(-(-ext[d] // block[d]) for d in inner.op.loops)),
            "volume": int(inner.volume(ext, block))}
