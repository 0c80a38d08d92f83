"""The engine loop: one thread that takes jobs from the ``Engine`` and generates one sequence
at a time with ``CausalLM.stream_text``. A batching scheduler replaces this class: it takes
jobs the same way and sends the same events."""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from tvm_roller.core.errors import first_lines
from tvm_roller.tools.serve.engine import Engine, Event, Job

log = logging.getLogger("tvm_roller.serve")


class SerialWorker:
    """Runs each job to its end, or to the token after its client went away (the cancel flag
    is read before every token: the model is never asked for one more)."""

    def __init__(self, engine: Engine, lm):
        self.engine, self.lm = engine, lm
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tvm-roller-engine",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new jobs, fail the waiting ones, let the running one finish."""
        self.engine.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        try:
            while True:
                job = self.engine.take()
                if job is None:
                    return
                self.run(job)
        finally:  # however the loop ends, no waiting request is left without an answer
            self.engine.close()

    def run(self, job: Job) -> None:
        m = self.engine.metrics
        if job.cancelled:  # its client left while it waited
            m.requests.labels("cancelled").inc()
            return
        started = time.perf_counter()
        m.queue_time.observe(started - job.arrived)
        m.running.inc()
        outcome = "error"
        try:
            outcome = self._generate(job, started)
        except Exception as e:  # noqa: BLE001 - the request gets the error, the loop goes on
            log.exception("request %s failed", job.id)
            job.send(Event("error", message=first_lines(e)))
        finally:
            m.running.dec()
            m.requests.labels(outcome).inc()
            m.duration.observe(time.perf_counter() - job.arrived)

    def _generate(self, job: Job, started: float) -> str:
        m, p = self.engine.metrics, job.params
        stream = self.lm.stream_text(job.prompt_ids, p.max_tokens, **p.stream_options())
        m.prompt_tokens.inc(stream.prompt_tokens)
        first = last = None
        for chunk in stream:
            now = time.perf_counter()
            if first is None:
                first = now
                m.ttft.observe(now - job.arrived)
            else:
                m.itl.observe(now - last)
            last = now
            m.generated_tokens.inc()
            job.send(Event("text", chunk.text, chunk.finish_reason))
            if job.cancelled and chunk.finish_reason is None:
                stream.close()
                log.info("request %s cancelled after %d tokens", job.id, len(stream.token_ids))
                return "cancelled"
        timings = self._timings(job, stream, started, first, last)
        m.decode_tok_s.set(timings.get("decode_tok_s", 0.0))
        usage = {"prompt_tokens": stream.prompt_tokens,
                 "completion_tokens": len(stream.token_ids),
                 "total_tokens": stream.prompt_tokens + len(stream.token_ids)}
        job.send(Event("done", finish_reason=stream.finish_reason, usage=usage,
                       timings=timings))
        log.info("request %s: %d prompt + %d tokens, %s; first token %.1f ms, decode %.1f "
                 "tok/s", job.id, usage["prompt_tokens"], usage["completion_tokens"],
                 stream.finish_reason, 1e3 * timings["ttft_s"], timings.get("decode_tok_s", 0))
        return stream.finish_reason or "length"

    @staticmethod
    def _timings(job: Job, stream, started: float, first, last) -> dict:
        """Per-request seconds for a study of the server's overhead: ``queue_s`` (arrival to
        the worker), ``ttft_s`` / ``total_s`` (arrival to the first / last token), and the
        generation's own (``TextStream.timings``: ``generation_s``, prefill, decode)."""
        lib = stream.timings()
        out = {"queue_s": started - job.arrived,
               "ttft_s": (first or started) - job.arrived,
               "total_s": (last or started) - job.arrived,
               "generation_s": lib.pop("total_s"), "first_token_s": lib.pop("first_token_s")}
        out.update(lib)
        return out
