"""The cache kernels' tiles come from the device model: the vector width and registers of the
target's ISA, its first cache level and the level a head's keys and values live in."""
from __future__ import annotations

import pytest

from conftest import device_for
from tvm_roller.backends.cpu.attention_plan import STACK_ARRAY_BYTES, plan_tiles
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware import preset

AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
AVX2 = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}
NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1", "num-cores": 4}


@pytest.mark.parametrize("target,lanes", [(AVX512, 16), (AVX2, 8), (NEON, 4)])
@pytest.mark.parametrize("head_dim,group", [(64, 7), (128, 4), (80, 1), (64, 32), (256, 2)])
def test_tiles_fit_the_targets_registers_and_first_cache(target, lanes, head_dim, group):
    dev = device_for(target)
    t = plan_tiles(dev, head_dim, 1152, group)
    assert t.lanes == lanes
    # the register tile: accumulators, one key vector and a broadcast query in the registers,
    # and a stack array TVM keeps in registers
    assert t.wide % lanes == 0 and t.sub * (t.wide // lanes) + t.wide // lanes + 1 \
        <= dev.num_vector_registers
    assert t.sub * t.wide * 4 < STACK_ARRAY_BYTES
    # a block: whole register tiles, its keys and values together in L1 (not one more doubling)
    assert t.block % t.wide == 0
    assert 2 * head_dim * t.block * 4 <= dev.levels[0].capacity_bytes \
        < 2 * head_dim * 2 * t.block * 4 or t.block == t.wide
    assert t.rows % t.sub == 0
    assert group % t.group_sub == 0 and t.group_sub * lanes * 4 < STACK_ARRAY_BYTES


def test_wider_vectors_take_wider_tiles():
    wide = plan_tiles(device_for(AVX512), 64, 1152, 7)
    narrow = plan_tiles(device_for(AVX2), 64, 1152, 7)
    assert (wide.lanes, narrow.lanes) == (16, 8)
    assert wide.sub * wide.wide > narrow.sub * narrow.wide


def test_a_cache_past_the_private_levels_takes_more_queries_per_task():
    """Keys and values streamed from a shared level (slower per core) are reused by more
    queries, up to that level's balance point."""
    dev = device_for(AVX512)
    near = plan_tiles(dev, 64, 1024, 7)
    far = plan_tiles(dev, 64, 1 << 20, 7)  # 512 MiB a head: past the L3
    assert far.rows > near.rows
    dram = dev.levels[-1]
    assert far.rows / 2 >= dev.peak_per_unit("float32") / (dram.bandwidth_gbs / dev.num_units)


def test_a_gpu_model_is_declined():
    with pytest.raises(UnsupportedError, match="CPU kernels"):
        plan_tiles(preset("h100"), 64, 1024, 1)
