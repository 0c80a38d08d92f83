"""The bookkeeping of a paged key/value cache: a pool of fixed-size blocks of positions shared
by the sequences in flight, and a block table per sequence (vLLM's PagedAttention idea).

Memory follows the tokens in flight: a sequence holds ``ceil(length / block)`` blocks, taken
from the pool as it grows and returned the moment it finishes, is cancelled or is preempted.
A sequence never sees another's blocks: a block belongs to one table at a time. The kernels
read a sequence's positions through its table (``table(seq)``: block ids in position order);
this module holds no tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List


class PoolExhausted(Exception):
    """Not enough free blocks for what was asked (nothing was taken)."""


@dataclass(frozen=True)
class PoolSize:
    """``blocks`` blocks of ``block`` positions each."""

    blocks: int
    block: int

    @staticmethod
    def from_bytes(budget_bytes: int, block: int, bytes_per_position: int) -> "PoolSize":
        """The most whole blocks ``budget_bytes`` holds (``bytes_per_position``: keys and values
        of every layer for one position)."""
        if block < 1 or bytes_per_position < 1:
            raise ValueError("block and bytes_per_position must be positive")
        return PoolSize(budget_bytes // (block * bytes_per_position), block)


class BlockPool:
    """Free blocks and each sequence's table. ``reserve(seq, length)`` makes ``seq``'s table
    cover ``length`` positions (taking only the blocks it lacks, all or none);
    ``release(seq)`` returns its blocks."""

    def __init__(self, size: PoolSize):
        if size.blocks < 1 or size.block < 1:
            raise ValueError(f"a pool needs at least one block of at least one position: {size}")
        self.size = size
        self._free: List[int] = list(range(size.blocks - 1, -1, -1))  # pop() gives 0 first
        self._tables: Dict[object, List[int]] = {}

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, length: int) -> int:
        return -(-length // self.size.block)

    def missing(self, seq, length: int) -> int:
        """Blocks ``seq`` would take from the pool to cover ``length`` positions."""
        return max(0, self.blocks_for(length) - len(self._tables.get(seq, ())))

    def can_reserve(self, seq, length: int) -> bool:
        return self.missing(seq, length) <= len(self._free)

    def reserve(self, seq, length: int) -> List[int]:
        """``seq``'s table, grown to cover ``length`` positions; ``PoolExhausted`` (and no
        block taken) when the pool has too few free blocks."""
        need = self.missing(seq, length)
        if need > len(self._free):
            raise PoolExhausted(f"{need} blocks needed for {length} positions, "
                                f"{len(self._free)} free of {self.size.blocks}")
        table = self._tables.setdefault(seq, [])
        table.extend(self._free.pop() for _ in range(need))
        return list(table)

    def table(self, seq) -> List[int]:
        """``seq``'s block ids in position order (empty for a sequence holding none)."""
        return list(self._tables.get(seq, ()))

    def release(self, seq) -> int:
        """Return ``seq``'s blocks to the pool (finished, cancelled or preempted); how many."""
        table = self._tables.pop(seq, [])
        self._free.extend(reversed(table))
        return len(table)

    def holders(self) -> List[object]:
        """The sequences holding blocks, oldest reservation first."""
        return list(self._tables)
