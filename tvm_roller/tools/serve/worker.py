"""The serial engine loop: one thread that takes jobs from the ``Engine`` and generates one
sequence at a time with ``CausalLM.stream_text`` (``--max-batch 1``). ``BatchWorker`` takes
jobs the same way and sends the same events, many sequences at once."""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from tvm_roller.core.errors import first_lines
from tvm_roller.tools.serve.engine import Engine, Event, Job
from tvm_roller.tools.serve.progress import Progress

log = logging.getLogger("tvm_roller.serve")


class WorkerThread:
    """The engine loop's thread: ``start``, ``stop`` (refuse new jobs, fail the waiting ones,
    let the running ones finish), ``alive`` (the health check's). ``_loop`` is the worker's."""

    def __init__(self, engine: Engine, lm):
        self.engine, self.lm = engine, lm
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._guarded_loop, name="tvm-roller-engine",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self.engine.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _guarded_loop(self) -> None:
        try:
            self._loop()
        finally:  # however the loop ends, no waiting request is left without an answer
            self.engine.close()

    def _loop(self) -> None:
        raise NotImplementedError


class SerialWorker(WorkerThread):
    """Runs each job to its end, or to the token after its client went away (the cancel flag
    is read before every token: the model is never asked for one more)."""

    def _loop(self) -> None:
        while True:
            job = self.engine.take()
            if job is None:
                return
            self.run(job)

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
        progress = Progress(job, stream, m, started)
        for chunk in stream:
            progress.token(chunk)
            if job.cancelled and chunk.finish_reason is None:
                stream.close()
                log.info("request %s cancelled after %d tokens", job.id, len(stream.token_ids))
                return "cancelled"
        return progress.done()
