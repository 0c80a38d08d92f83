"""One request's generation as the server reports it, whichever worker runs it: each token's
text event and latency metrics (``Progress.token``), then the final "done" event with the
usage and per-request timings (``Progress.done``)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional

from tvm_roller.integrations.llm.text import TextChunk, TextStream
from tvm_roller.tools.serve.engine import Event, Job
from tvm_roller.tools.serve.metrics import ServerMetrics

log = logging.getLogger("tvm_roller.serve")


@dataclass
class Progress:
    """``job`` generating through ``stream`` since ``started`` (when a worker took it); when
    its first and latest tokens came."""

    job: Job
    stream: TextStream
    metrics: ServerMetrics
    started: float
    first: Optional[float] = None
    last: Optional[float] = None

    def token(self, chunk: TextChunk) -> None:
        """``chunk`` to the request, its latency to the metrics."""
        m, now = self.metrics, time.perf_counter()
        if self.first is None:
            self.first = now
            m.ttft.observe(now - self.job.arrived)
        else:
            m.itl.observe(now - self.last)
        self.last = now
        m.generated_tokens.inc()
        self.job.send(Event("text", chunk.text, chunk.finish_reason))

    def done(self) -> str:
        """The "done" event (usage, timings); the outcome for the metrics."""
        s = self.stream
        timings = self.timings()
        self.metrics.decode_tok_s.set(timings.get("decode_tok_s", 0.0))
        usage = {"prompt_tokens": s.prompt_tokens, "completion_tokens": len(s.token_ids),
                 "total_tokens": s.prompt_tokens + len(s.token_ids)}
        self.job.send(Event("done", finish_reason=s.finish_reason, usage=usage,
                            timings=timings))
        log.info("request %s: %d prompt + %d tokens, %s; first token %.1f ms, decode %.1f "
                 "tok/s", self.job.id, usage["prompt_tokens"], usage["completion_tokens"],
                 s.finish_reason, 1e3 * timings["ttft_s"], timings.get("decode_tok_s", 0))
        return s.finish_reason or "length"

    def timings(self) -> dict:
        """Per-request seconds for a study of the server's overhead: ``queue_s`` (arrival to
        the worker), ``ttft_s`` / ``total_s`` (arrival to the first / last token), and the
        generation's own (``TextStream.timings``: ``generation_s``, prefill, decode; a
        batched generation's decode tokens per second from its inter-token gap)."""
        lib = self.stream.timings()
        job, started = self.job, self.started
        out = {"queue_s": started - job.arrived,
               "ttft_s": (self.first or started) - job.arrived,
               "total_s": (self.last or started) - job.arrived,
               "generation_s": lib.pop("total_s"), "first_token_s": lib.pop("first_token_s")}
        out.update(lib)
        if "decode_tok_s" not in out and out["inter_token_s"] > 0:
            out["decode_tok_s"] = 1.0 / out["inter_token_s"]
        return out
