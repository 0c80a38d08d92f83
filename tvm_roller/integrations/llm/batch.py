"""Continuous batching over a paged cache (Orca's iteration-level scheduling, vLLM's paged
cache): ``BatchGenerator`` runs many sequences through one compiled ``CausalLM``.

Each ``step()``:

1. admits waiting sequences (oldest first) while fewer than ``max_batch`` run and the pool
   has blocks for the whole prompt;
2. prefills up to ``prefill_chunk`` prompt positions (oldest sequence first, a long prompt
   over several steps: the others keep decoding between its chunks);
3. runs one ``decode`` call for every sequence whose positions are all cached but its last
   token (``B`` rows: each projection reads the weights once for the batch), picks each
   sequence's next token and returns them.

A sequence's cache lives in pool blocks listed in its table (``BlockPool``); it takes a block
as it crosses into one and returns all of them when it is finished or cancelled
(``finish``). When a step needs a block and the pool has none, the newest running sequence is
preempted: its blocks go back, and it is prefilled again (its prompt and the tokens it made)
when blocks are free, so its tokens continue as they would have (ties excepted).
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Hashable, List, Tuple

import numpy as np
import tvm

from tvm_roller.integrations.llm.block_pool import BlockPool, PoolSize
from tvm_roller.integrations.llm.lm import CausalLM, new_cache

#: picks a sequence's next token: (its logits row, tokens it generated so far) -> token id
Picker = Callable[[np.ndarray, int], int]


@dataclass
class BatchSeq:
    """A sequence in flight: its tokens (prompt, then generated), how many of them are in the
    cache, and how it picks its next token."""

    key: Hashable
    tokens: List[int]
    prompt_len: int
    pick: Picker
    cached: int = 0
    preemptions: int = 0

    @property
    def pending(self) -> int:
        """Positions not in the cache yet (1: ready to decode its last token)."""
        return len(self.tokens) - self.cached

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class StepStats:
    """What the last ``step`` ran."""

    prefill_tokens: int = 0
    decode_rows: int = 0
    decode_s: float = 0.0  # the decode call's seconds (picking the tokens included)
    preempted: int = 0


class BatchGenerator:
    """Sequences added with ``add`` advance one token each per ``step`` (after their prompt is
    cached); ``finish`` (done or cancelled) returns a sequence's blocks at once."""

    def __init__(self, lm: CausalLM, pool_blocks: int, max_batch: int | None = None,
                 prefill_chunk: int = 128):
        max_batch = lm.max_batch if max_batch is None else max_batch
        if not 1 <= max_batch <= lm.max_batch:
            raise ValueError(f"max_batch must be in [1, {lm.max_batch}] (the model was "
                             f"compiled for batches up to {lm.max_batch}), got {max_batch}")
        if pool_blocks < lm.cache.max_blocks:
            raise ValueError(f"a pool of {pool_blocks} blocks cannot hold one sequence of "
                             f"max_seq_len {lm.max_seq_len} ({lm.cache.max_blocks} blocks of "
                             f"{lm.cache.block})")
        if prefill_chunk < 2:
            raise ValueError(f"prefill_chunk must be >= 2, got {prefill_chunk}")
        self.lm, self.max_batch, self.prefill_chunk = lm, max_batch, prefill_chunk
        self.pool = BlockPool(PoolSize(pool_blocks, lm.cache.block))
        self.keys, self.values = new_cache(lm.cache, pool_blocks, lm.device)
        self.waiting: Deque[BatchSeq] = collections.deque()
        self.running: Dict[Hashable, BatchSeq] = {}  # admission order
        self.stats = StepStats()

    @staticmethod
    def pool_blocks_for(lm: CausalLM, budget_bytes: int) -> int:
        """The blocks a cache of ``budget_bytes`` (keys and values) holds."""
        c = lm.cache
        return PoolSize.from_bytes(budget_bytes, c.block, c.position_bytes).blocks

    @property
    def free_blocks(self) -> int:
        return self.pool.free_blocks

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, key: Hashable, prompt_ids: List[int], pick: Picker, max_new: int) -> None:
        """Queue a sequence (``max_new``: the most tokens it will ask for, checked against
        the context)."""
        if key in self.running or any(s.key == key for s in self.waiting):
            raise ValueError(f"sequence {key!r} is in flight already")
        if not prompt_ids:
            raise ValueError("the prompt must hold at least 1 token")
        if len(prompt_ids) + max_new > self.lm.max_seq_len:
            raise ValueError(f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new}) exceeds "
                             f"max_seq_len ({self.lm.max_seq_len})")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.lm.vocab:
            raise ValueError(f"token ids must be in [0, {self.lm.vocab})")
        self.waiting.append(BatchSeq(key, [int(t) for t in prompt_ids], len(prompt_ids), pick))

    def finish(self, key: Hashable) -> None:
        """Drop a sequence (finished, or its client went away): its blocks return now."""
        self.pool.release(key)
        self.running.pop(key, None)
        self.waiting = collections.deque(s for s in self.waiting if s.key != key)

    def step(self) -> List[Tuple[Hashable, int]]:
        """One iteration: admissions, a prefill chunk, one decode call; the tokens made."""
        self.stats = StepStats()
        self._admit()
        self._prefill()
        return self._decode()

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            # the whole prompt's blocks, and one to grow into: no admission that the next
            # steps would preempt at once
            if self.pool.missing(seq.key, len(seq.tokens) + 1) > self.pool.free_blocks:
                return
            self.waiting.popleft()
            self.running[seq.key] = seq

    def _prefill(self) -> None:
        budget = self.prefill_chunk
        for seq in list(self.running.values()):
            if budget < 2 or seq.key not in self.running:
                return
            m = min(budget, seq.pending - 1)  # the last token goes with the decode batch
            if m < 1:
                continue
            if m == 1 and seq.pending > 2:
                continue  # one position is not a chunk: wait for the next step's budget
            if not self._reserve(seq, seq.cached + m):
                return
            ids = np.array([seq.tokens[seq.cached:seq.cached + m]], dtype="int64")
            self._run("decode" if m == 1 else "prefill", [seq], ids, m)
            seq.cached += m
            budget -= m
            self.stats.prefill_tokens += m

    def _decode(self) -> List[Tuple[Hashable, int]]:
        ready = []
        for seq in [s for s in self.running.values() if s.pending == 1]:
            # an older one's reservation may have preempted it: it must not take blocks
            if seq.key in self.running and self._reserve(seq, len(seq.tokens)):
                ready.append(seq)
        if not ready:
            return []
        t0 = time.perf_counter()
        ids = np.array([[s.tokens[-1]] for s in ready], dtype="int64")
        logits = self._run("decode", ready, ids, 1).numpy()
        out = []
        for row, seq in zip(logits, ready):
            seq.cached += 1
            token = int(seq.pick(row, seq.generated))
            seq.tokens.append(token)
            out.append((seq.key, token))
        self.stats.decode_rows = len(ready)
        self.stats.decode_s = time.perf_counter() - t0
        return out

    def _reserve(self, seq: BatchSeq, length: int) -> bool:
        """``seq``'s table grown to ``length`` positions, preempting the newest other running
        sequences while the pool lacks blocks; False when ``seq`` itself was preempted."""
        while not self.pool.can_reserve(seq.key, length):
            victim = next(reversed(self.running.values()))
            self._preempt(victim)
            if victim is seq:
                return False
        self.pool.reserve(seq.key, length)
        return True

    def _preempt(self, seq: BatchSeq) -> None:
        """Free ``seq``'s blocks; it waits first in line, to be prefilled again."""
        self.pool.release(seq.key)
        del self.running[seq.key]
        seq.cached = 0
        seq.preemptions += 1
        self.waiting.appendleft(seq)
        self.stats.preempted += 1

    def _run(self, name: str, seqs: List[BatchSeq], ids: np.ndarray, m: int):
        """``name`` over the ``m`` positions after each sequence's cached ones."""
        lengths = np.array([s.cached + m for s in seqs], dtype="int32")
        tables = [self.pool.table(s.key) for s in seqs]
        width = max(len(t) for t in tables)
        table = np.zeros((len(seqs), width), dtype="int32")
        for row, t in zip(table, tables):
            row[:len(t)] = t
        positions = lengths[:, None].astype("int64") - m + np.arange(m, dtype="int64")[None, :]
        dev = self.lm.device
        return self.lm.run(name, ids, positions, tvm.runtime.tensor(table, dev), lengths,
                           self.keys, self.values)
