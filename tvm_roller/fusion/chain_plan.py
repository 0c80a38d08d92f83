"""The result of ``plan_chain``: plain JSON data."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Dict, List


@dataclass
class ChainPlan:
    """Result of :func:`plan_chain`; every field is plain JSON data (``to_dict``/``from_dict``).

    Bytes and seconds. ``order``/``tiles``/``volume_*``/``time_*`` describe the plans with the
    least predicted time (parallelism included); ``least_*`` the plans with the least volume into
    the tile level (Chimera's own objective, parallelism ignored). ``volume_*``: per tensor, into
    the tile level (``tile_level``) from the outer level (Chimera's DM; unfused sums both ops).
    ``level_volume_*``/``terms_*`` are keyed by boundary ("L2<-L3": moved into L2, read from
    L3) and, when ``include_compute``, "compute"."""

    chain: Dict[str, Any]
    device: str
    tile_level: str
    tile_capacity_bytes: int  # usable capacity per core the tiles were sized for
    outer_level: str  # where the fused tiles stream from
    order: List[str]  # fused block order, outermost first (loops of extent 1 last)
    tiles: Dict[str, int]  # fused tile size per loop
    memory_usage_bytes: int  # fused MU
    tasks: int  # fused parallel tasks
    inner: List[Dict[str, Any]]  # per op: its fused block re-tiled for the inner level
    volume_fused: Dict[str, int]
    volume_unfused: Dict[str, int]
    total_fused: int
    total_unfused: int
    level_volume_fused: Dict[str, int]
    level_volume_unfused: Dict[str, int]
    terms_fused: Dict[str, float]
    terms_unfused: Dict[str, float]  # per-term sums over the unfused ops
    time_fused_s: float  # largest term
    time_unfused_s: float  # sum over the ops of each op's largest term
    compute_fused_s: float  # ideal-peak compute time (a term only when include_compute)
    compute_unfused_s: float
    bound_fused: str
    unfused_ops: List[Dict[str, Any]]  # per op: order, tiles, tasks, volumes, terms, time
    least_order: List[str]  # fused order/tiles/volumes with the least volume (Chimera)
    least_tiles: Dict[str, int]
    least_volume_fused: Dict[str, int]
    least_volume_unfused: Dict[str, int]
    least_total_fused: int
    least_total_unfused: int
    intermediates: List[Dict[str, Any]]  # name, shape, dtype, bytes, fits_tile_level
    include_compute: bool
    fuse: bool
    reason: str
    plan_s: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ChainPlan":
        return cls(**d)
