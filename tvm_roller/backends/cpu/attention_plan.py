"""The tiles of the attention kernels (over the key/value cache: ``kv_cache``,
``kv_prompt_attention``; over whole tensors: ``flash_attention``), planned from the device model:
nothing in those kernels is a hand-set ISA constant.

* ``lanes``: the float32 lanes of one vector, as the fp32 micro-kernel route declares them for
  the device (16 on AVX-512, 8 on AVX2, 4 on NEON).
* ``sub`` x ``wide``: the register tile of both products (queries x positions for Q·Kᵀ, queries x
  head-row elements for P·V): the fastest fp32 block the micro-kernel layer offers on the device
  (measured rate, else the route's preset; near-ties go to the block with more multiply-adds per
  load) that TVM keeps in registers (a stack array under ``STACK_ARRAY_BYTES``) and whose width
  divides the block.
* ``block``: positions per block of keys (the cache's layout, one decode task's slice of the
  context; a flash-attention step): the widest power-of-two multiple of ``wide`` whose keys and values (``head_dim`` each
  per position) fit the first cache level together, so a task's products reread them from L1.
* ``rows``: queries per prompt task: each block of keys and values comes from the level a kv
  head's keys and values live in once per ``rows`` queries, so ``rows`` is the multiple of ``sub`` that
  lifts the products' intensity (``rows / 2`` flops per byte) to that level's balance point
  (one core's peak over its bandwidth).
* ``group_sub``: query heads of a group in one decode register tile (one vector of positions
  each): the largest divisor of the group that fits the registers and the stack array.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tvm_roller.backends.cpu.microkernel import candidates, route_named
from tvm_roller.backends.cpu.microkernel.route import F32
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware.model import DeviceModel

#: TVM keeps a buffer allocated inside a kernel on the stack below this size (LLVM then holds it
#: in registers); a larger one is a heap workspace, stored to on every update
STACK_ARRAY_BYTES = 1024
FLOAT_BYTES = 4
NEAR_TIE = 0.98  # register blocks within 2% of the fastest rate count as equally fast


@dataclass(frozen=True)
class AttentionTiles:
    """The planned tiles of the attention kernels (see the module docstring)."""

    lanes: int
    sub: int
    wide: int
    block: int
    rows: int
    group_sub: int

    def to_dict(self) -> dict:
        return asdict(self)

    def row_part(self, head_dim: int, rows: int) -> int:
        """The widest slice of a head row (whole vectors dividing it) whose accumulators for
        ``rows`` queries stay a stack array; one vector's part when none does."""
        best = vector_part(head_dim, self.lanes)
        for width in range(self.lanes, head_dim + 1, self.lanes):
            if head_dim % width == 0 and rows * width * FLOAT_BYTES < STACK_ARRAY_BYTES:
                best = width
        return best


def vector_part(head_dim: int, lanes: int) -> int:
    """The widest power-of-two width up to ``lanes`` dividing a head row: a row is walked in
    whole parts of this width (head dimensions 72 or 80 included)."""
    return max(w for w in (1, 2, 4, 8, 16, 32, 64) if w <= lanes and head_dim % w == 0)


def plan_tiles(dev: DeviceModel, head_dim: int, length: int, group: int) -> AttentionTiles:
    """The tiles for ``length`` keys of ``head_dim``-element rows on ``dev``, read by
    ``group`` query heads per kv head."""
    if dev.kind != "cpu":
        raise UnsupportedError(f"the attention kernels are CPU kernels; {dev.name} is a "
                               f"{dev.kind}")
    lanes = route_named("fp32_fma").lanes(dev)
    sub, wide = _register_tile(dev, lanes)
    block = _block(dev, head_dim, wide)
    rows = _rows(dev, 2 * length * head_dim * FLOAT_BYTES, sub)
    return AttentionTiles(lanes, sub, wide, block, rows, _group_sub(dev, group, lanes))


def _register_tile(dev: DeviceModel, lanes: int):
    # a power-of-two number of vectors wide: the width divides a power-of-two block
    fit = [c for c in candidates(dev, F32) if c.route.name == "fp32_fma"
           and c.shape.rows * c.shape.cols * FLOAT_BYTES < STACK_ARRAY_BYTES
           and (c.shape.cols // lanes) & (c.shape.cols // lanes - 1) == 0]
    if not fit:
        raise UnsupportedError(f"{dev.name}: no fp32 register block fits a stack array")
    best = max(c.gops for c in fit)
    near = [c for c in fit if c.gops >= NEAR_TIE * best]
    top = max(near, key=lambda c: (c.shape.rows * c.shape.cols, c.gops))
    return top.shape.rows, top.shape.cols


def _block(dev: DeviceModel, head_dim: int, wide: int) -> int:
    l1 = dev.levels[0].capacity_bytes
    block = wide
    while 2 * head_dim * (2 * block) * FLOAT_BYTES <= l1:
        block *= 2
    return block


def _rows(dev: DeviceModel, head_bytes: int, sub: int) -> int:
    """Enough queries per task that a block read from the level holding a kv head's keys and
    values (``head_bytes`` at the cache's full length) costs no more than its products at one
    core's peak."""
    peak = dev.peak_per_unit("float32")
    level = next((lv for lv in dev.levels if lv.capacity_bytes >= head_bytes), dev.levels[-1])
    per_core = level.bandwidth_gbs / dev.num_units if level.shared else level.bandwidth_gbs
    need = 2.0 * peak / per_core  # flops per byte the level sustains, at rows / 2 per byte
    return sub * max(1, math.ceil(need / sub))


def _group_sub(dev: DeviceModel, group: int, lanes: int) -> int:
    # one accumulator vector per query head, beside the key vector and the query broadcast
    return max(g for g in range(1, group + 1) if group % g == 0
               and (g == 1 or (g * lanes * FLOAT_BYTES < STACK_ARRAY_BYTES
                               and g + 2 <= dev.num_vector_registers)))
