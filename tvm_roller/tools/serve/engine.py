"""Admission: an accepted request becomes a ``Job`` waiting in a bounded queue for the worker
(``worker.SerialWorker``, or a batching scheduler that takes jobs the same way). A full queue
refuses at once (``QueueFull``: the app's 429). A job's events (text, then done or an error)
go back to the request's event loop; its cancel flag is the worker's to check."""
from __future__ import annotations

import asyncio
import collections
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

from tvm_roller.tools.serve.metrics import ServerMetrics
from tvm_roller.tools.serve.schemas import GenerationParams


class QueueFull(Exception):
    """``max_queue`` requests are waiting already."""


class EngineClosed(Exception):
    """The server is shutting down: nothing new is taken."""


@dataclass
class Event:
    """What a job sends its request: ``kind`` "text" (a token's text, maybe ""; the last one
    has the ``finish_reason``), then "done" (``usage`` and ``timings``) or "error"."""

    kind: str
    text: str = ""
    finish_reason: Optional[str] = None
    usage: Dict[str, int] = field(default_factory=dict)
    timings: Dict[str, float] = field(default_factory=dict)
    message: str = ""


class Job:
    """One accepted request: its prompt ids and generation parameters, when it arrived, a
    cancel flag (the client went away) and the queue its events arrive in."""

    def __init__(self, prompt_ids: List[int], params: GenerationParams,
                 loop: asyncio.AbstractEventLoop):
        self.id = uuid.uuid4().hex[:24]
        self.prompt_ids, self.params = list(prompt_ids), params
        self.arrived = time.perf_counter()
        self.events: asyncio.Queue = asyncio.Queue()
        self._loop = loop
        self._cancel = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Stop generating at the next token (a finished job ignores it)."""
        self._cancel.set()

    def send(self, event: Event) -> None:
        """From any thread: ``event`` into the request's queue (dropped when its loop has
        closed: the request is gone)."""
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            self.cancel()


class Engine:
    """The bounded queue between the requests and the worker: ``submit`` (the event loop's
    side), ``take`` (the worker's), ``close`` (shutdown: waiting jobs get an error event)."""

    def __init__(self, max_queue: int = 32, metrics: Optional[ServerMetrics] = None):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.max_queue = max_queue
        self.metrics = metrics or ServerMetrics()
        self._waiting: Deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False

    def submit(self, prompt_ids: List[int], params: GenerationParams) -> Job:
        """A new job, queued; ``QueueFull`` when ``max_queue`` wait already (never blocks).
        Called in the request's event loop."""
        job = Job(prompt_ids, params, asyncio.get_running_loop())
        with self._cond:
            if self._closed:
                raise EngineClosed("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                self.metrics.requests.labels("rejected").inc()
                raise QueueFull(f"{len(self._waiting)} requests are waiting already "
                                f"(--max-queue {self.max_queue})")
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._cond.notify()
        return job

    def take(self, timeout: Optional[float] = None) -> Optional[Job]:
        """The oldest waiting job (blocks up to ``timeout``); None when closed or timed out."""
        with self._cond:
            self._cond.wait_for(lambda: self._waiting or self._closed, timeout)
            if self._closed or not self._waiting:
                return None
            job = self._waiting.popleft()
            self.metrics.queue_depth.set(len(self._waiting))
            return job

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    @property
    def depth(self) -> int:
        with self._cond:
            return len(self._waiting)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            left, self._waiting = list(self._waiting), collections.deque()
            self.metrics.queue_depth.set(0)
            self._cond.notify_all()
        for job in left:
            self.metrics.requests.labels("error").inc()
            job.send(Event("error", message="the server is shutting down"))
