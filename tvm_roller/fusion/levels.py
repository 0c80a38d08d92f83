"""The memory levels a plan uses (``tvm_roller.fusion.movement``'s docstring: the convention):
the tile level, the level inside it, the outer level the tiles stream from, and the bandwidth
each busy core gets from a level. ``dev`` is a duck-typed ``DeviceModel``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

_CPU_FILL = 0.5  # of a cache the tiles may use (backends/cpu/policy.py uses the same for L1/L2)
_GPU_FILL = 1.0  # shared memory is managed explicitly


def core_bandwidth(dev, idx: int, busy: Any) -> Any:
    """Bytes/s each of ``busy`` cores gets from level ``idx``."""
    lvl = dev.levels[idx]
    total = lvl.bandwidth_gbs * 1e9
    if not lvl.shared:
        return total + 0 * busy
    single = None
    if idx == len(dev.levels) - 1:
        traits = getattr(dev, "cpu", None)  # a GPU model has none
        single = traits.dram_gbs_single_core if traits is not None else None
    single = single * 1e9 if single else total / max(1, dev.num_units)
    return np.minimum(single, total / np.maximum(busy, 1))


def outer_level_index(dev, tile_idx: int, footprint: float) -> int:
    """The first level below the tile level that holds ``footprint`` bytes, else DRAM."""
    for i in range(tile_idx + 1, len(dev.levels) - 1):
        if footprint <= dev.levels[i].capacity_bytes:
            return i
    return len(dev.levels) - 1


@dataclass
class Levels:
    """The tile level, the level just inside it (None for the fastest) and the usable fraction."""

    tile: int
    inner: Optional[int]
    fill: float

    def usable(self, dev, idx: int) -> float:
        return dev.levels[idx].capacity_bytes * self.fill


def choose_levels(dev, fill: Optional[float], tile_level: Optional[str]) -> Levels:
    """The tile level (``tile_level``, else the largest private level) and the one inside it."""
    n = len(dev.levels)
    if tile_level is not None:
        tile = [lv.name for lv in dev.levels].index(tile_level)
    else:
        private = [i for i, lv in enumerate(dev.levels[:-1]) if not lv.shared]
        tile = private[-1] if private else 0
    if tile >= n - 1:
        raise ValueError("the tile level must be above the outermost memory level")
    if fill is None:
        fill = _CPU_FILL if getattr(dev, "kind", "cpu") == "cpu" else _GPU_FILL
    return Levels(tile, tile - 1 if tile > 0 else None, fill)
