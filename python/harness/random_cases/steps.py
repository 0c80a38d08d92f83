"""The steps of one check, timed, and which one is running (what an exception is blamed on)."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Optional

StepHook = Callable[[str], None]


class Steps:
    """``on_step`` hears each step's name as it starts: the worker passes it on to the parent,
    which then knows where a case hung or crashed."""

    def __init__(self, on_step: Optional[StepHook] = None) -> None:
        self.on_step = on_step
        self.stage = ""
        self.times: Dict[str, float] = {}
        self.started = time.perf_counter()

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.stage = name
        if self.on_step is not None:
            self.on_step(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"t_{name}"] = round(time.perf_counter() - t0, 4)

    def elapsed(self) -> float:
        return round(time.perf_counter() - self.started, 4)
