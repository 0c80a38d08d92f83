"""The batching engine loop (``--max-batch N`` > 1): one thread that admits jobs from the
``Engine`` between steps into a ``BatchGenerator`` (continuous batching over the paged KV
cache) and sends each token's text to its request as the step makes it.

A job leaves the batch, and its cache blocks return to the pool, the step its text ends (eos,
a stop string, ``max_tokens``) or the step after its client went away. The events are
``SerialWorker``'s: text, then done (or an error).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Dict, Optional

from tvm_roller.core.errors import first_lines
from tvm_roller.integrations.llm.batch import BatchGenerator
from tvm_roller.integrations.llm.sampling import Sampling, TokenPicker
from tvm_roller.integrations.llm.text import TextStream
from tvm_roller.tools.serve.engine import Engine, Event, Job
from tvm_roller.tools.serve.progress import Progress
from tvm_roller.tools.serve.worker import WorkerThread

log = logging.getLogger("tvm_roller.serve")


class TokenFeed:
    """A batched sequence's tokens as the iterator its ``TextStream`` pulls: the worker pushes
    each one before the stream reads it."""

    def __init__(self) -> None:
        self._next: Optional[int] = None

    def push(self, token: int) -> None:
        self._next = token

    def __iter__(self) -> "TokenFeed":
        return self

    def __next__(self) -> int:
        if self._next is None:
            raise StopIteration
        token, self._next = self._next, None
        return token


@dataclass
class InFlight:
    """An admitted job: its text stream and the feed behind it."""

    progress: Progress
    feed: TokenFeed


class BatchWorker(WorkerThread):
    """Jobs decode together, up to ``max_batch`` at once, in a pool of ``pool_blocks`` cache
    blocks; prompts are prefilled ``prefill_chunk`` positions a step."""

    def __init__(self, engine: Engine, lm, pool_blocks: int, max_batch: Optional[int] = None,
                 prefill_chunk: int = 128):
        super().__init__(engine, lm)
        if lm.tokenizer is None:
            raise ValueError("the batching worker needs the model's tokenizer")
        self.gen = BatchGenerator(lm, pool_blocks, max_batch, prefill_chunk)
        self.in_flight: Dict[str, InFlight] = {}
        engine.metrics.kv_blocks_total.set(pool_blocks)
        engine.metrics.kv_blocks_free.set(self.gen.free_blocks)

    def _loop(self) -> None:
        try:
            while self._admit():
                self._drop_cancelled()
                if len(self.gen):
                    self._step()
        finally:  # a loop that ends with jobs in flight (it failed) answers them
            self._fail_all("the engine stopped")

    def _admit(self) -> bool:
        """Jobs from the engine while the batch has room (waiting for one when nothing is in
        flight); False once the engine is closed and nothing is left to finish."""
        while len(self.gen) < self.gen.max_batch:
            job = self.engine.take(timeout=0 if self.in_flight else None)
            if job is None:
                return bool(self.in_flight) or not self.engine.closed
            self._start(job)
        return True

    def _start(self, job: Job) -> None:
        m, p = self.engine.metrics, job.params
        if job.cancelled:  # its client left while it waited
            m.requests.labels("cancelled").inc()
            return
        started = time.perf_counter()
        m.queue_time.observe(started - job.arrived)
        tokenizer = self.lm.tokenizer
        eos = frozenset() if p.ignore_eos else tokenizer.eos_token_ids
        feed = TokenFeed()
        stream = TextStream(feed, tokenizer, len(job.prompt_ids), p.max_tokens, p.stop, eos,
                            p.min_tokens)
        try:
            picker = TokenPicker(Sampling(p.do_sample, p.temperature, p.top_k, p.top_p, p.seed))
            banned, least = sorted(eos), p.min_tokens

            def pick(row, generated: int) -> int:
                return picker(row, banned if generated < least else ())

            self.gen.add(job.id, job.prompt_ids, pick, p.max_tokens)
        except ValueError as e:
            job.send(Event("error", message=first_lines(e)))
            m.requests.labels("error").inc()
            return
        m.prompt_tokens.inc(len(job.prompt_ids))
        m.running.inc()
        self.in_flight[job.id] = InFlight(Progress(job, stream, m, started), feed)

    def _drop_cancelled(self) -> None:
        for key, seq in list(self.in_flight.items()):
            if seq.progress.job.cancelled:
                log.info("request %s cancelled after %d tokens", key,
                         len(seq.progress.stream.token_ids))
                self._end(key, "cancelled")

    def _step(self) -> None:
        """One batch step; each token's text to its request, finished jobs out."""
        m = self.engine.metrics
        try:
            made = self.gen.step()
        except Exception as e:  # noqa: BLE001 - the batch's requests get the error, the loop goes on
            log.exception("a batch step failed")
            self._fail_all(first_lines(e))
            return
        stats = self.gen.stats
        m.batch_rows.set(stats.decode_rows)
        m.decode_rows.inc(stats.decode_rows)
        m.decode_seconds.inc(stats.decode_s)
        m.preemptions.inc(stats.preempted)
        for key, token in made:
            seq = self.in_flight[key]
            seq.feed.push(token)
            chunk = next(seq.progress.stream)
            seq.progress.token(chunk)
            if chunk.finish_reason is not None:
                self._end(key, seq.progress.done())
        m.kv_blocks_free.set(self.gen.free_blocks)

    def _end(self, key: str, outcome: str) -> None:
        """``key`` out of the batch: its blocks back to the pool now."""
        seq = self.in_flight.pop(key)
        self.gen.finish(key)
        m = self.engine.metrics
        m.running.dec()
        m.requests.labels(outcome).inc()
        m.duration.observe(time.perf_counter() - seq.progress.job.arrived)
        m.kv_blocks_free.set(self.gen.free_blocks)

    def _fail_all(self, message: str) -> None:
        for key, seq in list(self.in_flight.items()):
            seq.progress.job.send(Event("error", message=message))
            self._end(key, "error")
