"""The public single-op benchmark suite (TVM's ``te_workload.CONFIGS``) and its harness.

``workloads``  which workloads exist, how to create one, FLOPs and bytes.
``references`` float64 reference results and PyTorch / numpy peers.
``baselines``  the shared MetaSchedule-tuned records (the "tuned search" peer).
``runner``     ``run_suite``: construct, build, check, time and compare.
``runs``       stored runs (``--save-run``): per workload roller's / PyTorch's times and the
               machine class; the shipped ones in ``data/runs``.
``compare``    a run against a stored one (``--compare-to``): ratios to PyTorch, flags.

Submodules import TVM / torch lazily so that ``import tvm_roller.tools.suite`` stays cheap.
"""
from __future__ import annotations

from typing import Any

__all__ = ["run_suite", "list_workloads", "create"]


def __getattr__(name: str) -> Any:
    # Lazy re-exports: keep the CLI's --help fast and avoid import cycles with tvm_roller.
    if name == "run_suite":
        from tvm_roller.tools.suite.runner import run_suite

        return run_suite
    if name in ("list_workloads", "create"):
        from tvm_roller.tools.suite import workloads

        return getattr(workloads, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
