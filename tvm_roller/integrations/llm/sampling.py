"""The next token from a row of logits: greedy, or sampled as HF's ``generate`` does
(temperature, then top-k, then top-p, then a draw), with a seeded generator."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """``do_sample=False``: the arg-max. Otherwise logits / ``temperature``, the ``top_k``
    largest kept (0: all), the smallest set whose probability reaches ``top_p`` kept (1.0: all),
    one token drawn with ``seed``'s generator."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    seed: Optional[int] = None

    def __post_init__(self):
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class TokenPicker:
    """Picks tokens under one ``Sampling`` (one generator per generation: reproducible)."""

    def __init__(self, sampling: Sampling):
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)

    def __call__(self, logits: np.ndarray, banned: Sequence[int] = ()) -> int:
        """``banned``: ids never picked (their logits -inf: eos before ``min_new_tokens``)."""
        s = self.sampling
        row = np.asarray(logits, dtype=np.float64).reshape(-1)
        if len(banned):
            row = row.copy()
            row[list(banned)] = -np.inf
        if not s.do_sample:
            return int(np.argmax(row))
        row = row / s.temperature
        if 0 < s.top_k < row.size:
            kth = np.partition(row, -s.top_k)[-s.top_k]
            row = np.where(row < kth, -np.inf, row)
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        if s.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            # keep the tokens before the mass reaches top_p, and the one that reaches it
            drop = order[np.concatenate(([False], cum[:-1] >= s.top_p))]
            probs[drop] = 0.0
            probs /= probs.sum()
        return int(self.rng.choice(row.size, p=probs))
