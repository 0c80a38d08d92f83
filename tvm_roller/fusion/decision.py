"""A GEMM chain's fusion decision as immutable plain data (what a backend's chain rule plans)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Generic, Tuple, TypeVar

M = TypeVar("M")  # the backend's model output: movement.ChainPlan on a CPU, CudaChainPlan on CUDA


@dataclass(frozen=True)
class ChainDecision(Generic[M]):
    """Fuse the chain into one kernel or run its operators one by one, and why.

    ``rows``: the rows of the first matmul's output one fused task (CPU) or thread block (CUDA)
    computes; ``model``: the backend's data-movement plan the decision was read from (its
    figures, for benchmarks and ``explain``); ``lines``: the decision described for ``explain``;
    ``prediction``: the backend's predicted times of both versions and the fused kernel's
    tiles, when it predicts them (CPU: ``chain_plan.ChainTimes``)."""

    fuse: bool
    reason: str
    rows: int
    model: M
    lines: Tuple[str, ...] = ()
    prediction: Any = None

    def refused(self, why: str) -> "ChainDecision[M]":
        """This decision turned to "operators one by one" because ``why``."""
        return dataclasses.replace(self, fuse=False, reason=f"{self.reason}; {why}")
