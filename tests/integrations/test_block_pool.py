"""The paged cache's block pool (``integrations.llm.block_pool``): tables grow block by block,
all or nothing; blocks come back on release; no block is ever in two tables; random
interleavings of growth and release keep the pool whole."""
from __future__ import annotations

import random

import pytest

from tvm_roller.integrations.llm.block_pool import BlockPool, PoolExhausted, PoolSize


def test_tables_grow_by_whole_blocks_and_come_back():
    pool = BlockPool(PoolSize(blocks=5, block=16))
    assert pool.reserve("a", 1) == [0]
    assert pool.reserve("a", 16) == [0]  # still one block
    assert pool.reserve("a", 17) == [0, 1]
    assert pool.reserve("b", 33) == [2, 3, 4]
    assert pool.free_blocks == 0
    assert not pool.can_reserve("a", 33) and pool.can_reserve("a", 32)
    with pytest.raises(PoolExhausted):
        pool.reserve("a", 33)
    assert pool.table("a") == [0, 1]  # a refused reservation takes nothing
    assert pool.release("b") == 3 and pool.free_blocks == 3
    assert pool.reserve("a", 5 * 16) == [0, 1, 2, 3, 4]
    assert pool.release("a") == 5 and pool.free_blocks == 5
    assert pool.release("gone") == 0 and pool.table("gone") == []


def test_size_from_a_byte_budget():
    # 2 layers × 2 (keys, values) × 4 kv heads × 64 dims × 4 bytes = 4096 bytes a position
    size = PoolSize.from_bytes(10 * 4096 * 32 + 100, block=32, bytes_per_position=4096)
    assert size == PoolSize(10, 32)
    with pytest.raises(ValueError):
        BlockPool(PoolSize(0, 32))
    with pytest.raises(ValueError):
        PoolSize.from_bytes(1 << 20, block=0, bytes_per_position=4)


@pytest.mark.parametrize("seed", [1, 7, 13])
def test_random_growth_and_release_never_share_a_block(seed):
    rng = random.Random(seed)
    pool = BlockPool(PoolSize(blocks=37, block=rng.choice([1, 3, 16])))
    lengths = {}
    for _ in range(2000):
        seq = rng.randrange(11)
        if rng.random() < 0.2:
            pool.release(seq)
            lengths.pop(seq, None)
            continue
        grown = lengths.get(seq, 0) + rng.randint(1, 40)
        if pool.can_reserve(seq, grown):
            assert len(pool.reserve(seq, grown)) == pool.blocks_for(grown)
            lengths[seq] = grown
        else:
            with pytest.raises(PoolExhausted):
                pool.reserve(seq, grown)
        held = [b for s in pool.holders() for b in pool.table(s)]
        assert len(held) == len(set(held))  # no block in two tables
        assert len(held) + pool.free_blocks == 37  # none lost
        assert all(len(pool.table(s)) == pool.blocks_for(n) for s, n in lengths.items())
