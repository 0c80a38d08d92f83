"""What happened to each function roller was asked to schedule, and the summary of a module's."""
from __future__ import annotations

import logging
import warnings
from dataclasses import asdict, dataclass
from typing import List, Optional

from tvm_roller.core.errors import FallbackWarning

logger = logging.getLogger("tvm_roller")


@dataclass
class FuncReport:
    """What happened to one PrimFunc: scheduled by roller, or left to TVM's default (and why)."""

    name: str
    status: str                     # "roller" or "fallback"
    kind: str = ""                  # roller's class: tiled / reduction / elementwise / operators
    rtile: Optional[dict] = None    # the applied rTile as plain data
    predicted_s: Optional[float] = None
    reason: str = ""                # why roller declined, or the error it hit
    # "" (scheduled by roller), "decline" (roller does not handle it: the reason says why) or
    # "error" (roller failed on it: a defect, the reason has the exception type and message);
    # a function roller split into operators reports the worst of its parts
    fallback: str = ""
    cached: bool = False            # the plan came from the schedule cache
    schedule_s: float = 0.0         # time spent planning + scheduling this function
    fusion: str = ""                # a matmul chain: "fused" / "unfused", and the model's reason
    # a function with symbolic extents: one dict per bucket kernel (the values it takes, the
    # values it was planned at, its tile; ``planner.buckets``)
    buckets: Optional[list] = None
    # the roofline lower bound (``planner.roofline``; at the largest bucket for symbolic
    # extents) and what bounds it: "compute" or the memory level the data lives in
    bound_s: Optional[float] = None
    bound_by: str = ""
    # with ``verify=True``: how roller's kernel compared with TVM's default build on random
    # inputs (``planner.verify``), or why it was not checked
    verified: str = ""
    # the scheduled kernel's loop-nest facts (``analysis.kernel_facts``): why a kernel can sit
    # far above its bound (parallel regions, vector lanes, strided or gathered accesses)
    facts: Optional[dict] = None
    # a constant operand packed into panels while compiling (the kernel is "<name>_prepacked":
    # ``integrations.relax.passes.prepack``)
    prepacked: bool = False
    # with top-k measured (``relax.compile(measure_topk=k)``): how the kernel was chosen
    measured: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def summarise(entries: List[FuncReport]) -> None:
    """Log a module's counts; warn (FallbackWarning) about every function left to TVM's default
    and every roller error inside a function built as its operators."""
    n_roller = sum(e.status == "roller" for e in entries)
    n_cached = sum(e.cached for e in entries)
    fallbacks = [e for e in entries if e.status == "fallback"]
    errors = [e for e in entries if e.fallback == "error"]
    logger.info("tvm_roller: %d PrimFuncs: %d scheduled by roller (%d from cache), %d left to "
                "TVM's default, %d roller errors", len(entries), n_roller, n_cached,
                len(fallbacks), len(errors))
    if fallbacks:
        detail = "; ".join(f"{e.name} ({e.fallback}): {e.reason}" for e in fallbacks)
        warnings.warn(f"roller left {len(fallbacks)} of {len(entries)} PrimFuncs to TVM's "
                      f"default: {detail}", FallbackWarning, stacklevel=3)
    split_errors = [e for e in errors if e.status == "roller"]
    if split_errors:
        detail = "; ".join(f"{e.name}: {e.reason}" for e in split_errors)
        warnings.warn(f"roller errors inside {len(split_errors)} PrimFuncs built as their "
                      f"operators: {detail}", FallbackWarning, stacklevel=3)
