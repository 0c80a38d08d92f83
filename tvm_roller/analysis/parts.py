"""A function rewritten into independent parts, each planned alone and stitched back in order.

A rewrite of the analysis layer (:mod:`~tvm_roller.analysis.parity`: a transposed convolution
as one sub-convolution per output parity class) returns a :class:`Decomposition`: the rewritten
function, which holds every part's blocks one after another under its root (it is a valid,
unscheduled PrimFunc with the original parameters: building it as it is gives the original
function's results), and which blocks make up each part. The planner cuts it into one PrimFunc
per part (``fusion.split.split_groups``: a buffer one part writes and a later one reads becomes
an intermediate of the stitched function), plans each with the ordinary rules and stitches the
scheduled bodies back together (``api``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from tvm import tirx


@dataclass(frozen=True)
class Decomposition:
    """``func`` rewritten into parts (plain data but the rewritten function)."""

    kind: str  # what rewrote it, e.g. "parity"
    reason: str  # one sentence for explain: what was rewritten and why
    func: tirx.PrimFunc  # the rewritten function: every part's blocks, in order
    groups: Tuple[Tuple[str, ...], ...]  # the block names of each part, in order
    labels: Tuple[str, ...]  # a short name per part ("prologue", "h%2=1 w%2=0", ...)
    notes: Tuple[str, ...] = ()  # more lines for explain

    def __post_init__(self) -> None:
        if len(self.groups) != len(self.labels) or not self.groups:
            raise ValueError("a decomposition needs one label per part and at least one part")
