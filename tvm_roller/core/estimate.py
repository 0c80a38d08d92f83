"""From a prediction's terms to a latency: the largest term bounds it, plus a fixed overhead.

Every micro-model (each backend's tiled and streaming predictions) ends with this step, so the
rTile records its terms, which one bounds it and the predicted time the same way.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from tvm_roller.core.rtile import RTile


def finish(t: RTile, terms: Dict[str, float], overheads: Sequence[float],
           num_tasks: Optional[int] = None) -> RTile:
    """Record ``terms`` on ``t`` (4 significant digits), the bounding term, and
    ``predicted_s`` = the largest term + each of ``overheads`` (added in order, so a prediction
    does not depend on how its overheads are grouped); ``num_tasks`` when given."""
    bound = max(terms, key=terms.get)
    t.terms = {k: float(f"{v:.4g}") for k, v in terms.items()}
    t.bound = bound
    t.predicted_s = terms[bound]
    for overhead in overheads:
        t.predicted_s += overhead
    if num_tasks is not None:
        t.num_tasks = num_tasks
    return t
