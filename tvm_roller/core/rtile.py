"""rTile: a tile shape per memory level, plus the alignment rules that make it hardware-friendly.

An ``RTile`` is plain data (it prints and round-trips through JSON): the policy builds it, the
micro-model annotates it, and a backend's lowering applies it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from tvm_roller.core.errors import InvalidTile


@dataclass
class RTile:
    """A constructed schedule for one PrimFunc's main block.

    Tiles are per axis of the main block, in block-axis order. ``reg`` is the register tile
    (reduction axes 1), ``l1`` the tile swept while it sits in L1 (spatial and reduction chunk),
    ``l2`` the per-task tile (spatial; reduction equal to ``l1``'s chunk) that one core owns.
    """

    kind: str  # "tiled", "reduction", "elementwise"
    axes: List[str]
    extents: List[int]
    axis_kinds: str  # e.g. "SSSR"
    reg: List[int]
    l1: List[int]
    l2: List[int]
    vector_axis: Optional[int]
    vector_lanes: int
    acc_level: str = "task"  # where the accumulator lives: "reg" (full reduction) or "task"
    num_tasks: int = 1  # parallel tasks (L2 tiles or row chunks)
    pack: List[str] = field(default_factory=list)  # operands packed into a contiguous tile
    unroll: int = 0  # auto-unroll step for the micro-kernel
    predicted_s: float = 0.0
    bound: str = ""  # the term that bounds the prediction: compute / L1 / L2 / DRAM / ...
    terms: Dict[str, float] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)  # alignment and policy decisions, for explain
    # CUDA backend (``backend == "cuda"``): ``reg`` is a thread's register tile (a warp's tile
    # with tensor cores), ``l1`` a thread block's shared-memory tile, ``l2`` equals ``l1`` and
    # ``num_tasks`` counts thread blocks.
    backend: str = "cpu"
    threads: int = 0  # threads per block
    stages: int = 1  # shared-memory pipeline depth (2: double buffering)
    tensor_core: str = ""  # "" or the fragment shape used, e.g. "wmma_16x16x16_f16f32"
    smem_bytes: int = 0  # shared memory per block, all stages
    # a bucket of a function with symbolic extents (``planner.buckets``): the largest
    # fraction of extra work padding the dynamic axes at run time costs in the bucket
    bucket_waste: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RTile":
        return cls(**json.loads(text))

    def check_shape(self) -> None:
        """Self-consistency of a tile read from disk (raises InvalidTile): every per-axis field
        has one positive integer per axis, the scalars are in range."""
        n = len(self.extents)
        if not (isinstance(self.kind, str) and isinstance(self.axis_kinds, str)
                and len(self.axis_kinds) == n):
            raise InvalidTile("tile kind/axis_kinds malformed")
        for name in ("extents", "reg", "l1", "l2"):
            xs = getattr(self, name)
            if not (isinstance(xs, list) and len(xs) == n and
                    all(_is_int(x) and x >= 1 for x in xs)):
                raise InvalidTile(f"tile field {name} is not {n} positive integers")
        if not (_is_int(self.vector_lanes) and self.vector_lanes >= 1 and
                _is_int(self.num_tasks) and self.num_tasks >= 1 and _is_int(self.unroll)
                and self.unroll >= 0):
            raise InvalidTile("tile vector_lanes/num_tasks/unroll out of range")
        if self.vector_axis is not None and not (_is_int(self.vector_axis) and
                                                 0 <= self.vector_axis < n):
            raise InvalidTile("tile vector_axis out of range")
        if not (isinstance(self.pack, list) and all(isinstance(p, str) for p in self.pack)):
            raise InvalidTile("tile pack is not a list of names")

    def key(self) -> tuple:
        return (tuple(self.reg), tuple(self.l1), tuple(self.l2), tuple(self.pack))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def padding_waste(extent: int, tile: int) -> float:
    """Fraction of extra work if ``extent`` is padded up to a multiple of ``tile``."""
    return (ceil_div(extent, tile) * tile - extent) / extent


def worst_padding_waste(low: int, high: int, tile: int) -> float:
    """The largest :func:`padding_waste` of any extent in ``[low, high]`` padded to ``tile``:
    at ``low``, or at the first extent past a multiple of the tile (one element into a new
    tile wastes the most, and less the longer the extent)."""
    worst = padding_waste(low, tile)
    first = low + (1 - low) % tile  # the smallest extent >= low that is 1 mod tile
    if tile > 1 and first <= high:
        worst = max(worst, padding_waste(first, tile))
    return worst


def aligned_steps(extent: int, base: int, limit: Optional[int] = None, eps: float = 0.25,
                  multiples: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24,
                                              28, 32, 48, 64, 96, 128)) -> List[int]:
    """Candidate tile sizes along one axis: multiples of ``base`` (the alignment unit).

    A size that does not divide ``extent`` is kept only when padding the axis to it wastes at
    most ``eps`` of the work (ROLLER's tensor-shape alignment); the full extent is always a
    candidate, so small and prime axes can be taken whole.
    """
    limit = extent if limit is None else min(limit, extent)
    out = []
    for m in multiples:
        t = m * base
        if t > limit:
            break
        if extent % t == 0 or padding_waste(extent, t) <= eps:
            out.append(t)
    if extent <= limit and extent not in out:
        out.append(extent)
    if not out:
        out.append(min(base, extent))
    return sorted(set(out))
