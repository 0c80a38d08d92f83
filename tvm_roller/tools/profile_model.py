"""Each kernel of a compiled model measured against its roofline bound and roller's prediction.

What ``tvm-roller profile-model`` runs: the model is compiled with roller's Relax pipeline (its
report gives every PrimFunc's lower bound and prediction), each kernel is timed in the model
by the Relax VM instrument, and a kernel that takes 10x its bound or more while it matters
(>= 50 us or >= 1% of the model's time) is flagged, so a 12-second kernel never ships silently.

    rows = profile(vm, arg, report)
    print(format_profile(rows))
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

from tvm_roller.tools.kernel_timing import kernel_calls

#: a kernel this many times its roofline bound or more is flagged (when it matters)
FLAG_RATIO = 10.0
#: ... when it takes at least this long per call, or this share of the model's kernel time
FLAG_MIN_S = 50e-6
FLAG_MIN_SHARE = 0.01
#: a flagged kernel's arithmetic explains it when it needs this share of its time at the peak
ARITH_SHARE = 0.25


@dataclass
class KernelRow:
    """One kernel of the model: its time per model call and what roller said of it."""

    name: str
    measured_s: float  # all its invocations in one call of the model
    share: float  # of all kernels' time (VM builtins included)
    invocations: int = 1  # per call of the model (a layer's kernel runs once a layer)
    status: str = ""  # roller / fallback; "" for a VM builtin (allocation, reshape, ...)
    kind: str = ""
    fallback: str = ""
    reason: str = ""
    bound_s: Optional[float] = None
    bound_by: str = ""
    predicted_s: Optional[float] = None
    facts: Optional[dict] = None  # the kernel's loop-nest facts (``analysis.kernel_facts``)
    flag: str = ""  # that it is flagged and why ("" when it is not)

    @property
    def over_bound(self) -> Optional[float]:
        """One invocation's time over the bound (the bound is of one invocation)."""
        return self.measured_s / self.invocations / self.bound_s if self.bound_s else None

    def to_dict(self) -> dict:
        return dict(asdict(self), over_bound=self.over_bound)


def profile(vm, arg, report: List[dict], calls: int = 10,
            fork_join_s: float = 0.0, func: str = "main") -> List[KernelRow]:
    """Every kernel ``vm[func](arg)`` runs (a tuple ``arg``: the arguments), slowest first,
    with its report entry and flag; ``fork_join_s``: what an empty parallel region costs here
    (``bench.measure.fork_join_s``), to tell a kernel too small to reach its bound."""
    times = kernel_calls(vm, arg, calls, func)
    total = sum(t for t, _ in times.values()) or 1.0
    entries: Dict[str, dict] = {e["name"]: e for e in report}
    rows = []
    for name, (seconds, n) in sorted(times.items(), key=lambda kv: -kv[1][0]):
        e = entries.get(name, {})
        row = KernelRow(name, seconds, seconds / total, max(n, 1), e.get("status", ""),
                        e.get("kind", ""), e.get("fallback", ""), e.get("reason", ""),
                        e.get("bound_s"), e.get("bound_by", ""), e.get("predicted_s"),
                        e.get("facts"))
        row.flag = _flag(row, fork_join_s)
        rows.append(row)
    return rows


def _flag(row: KernelRow, fork_join_s: float) -> str:
    matters = row.measured_s / row.invocations >= FLAG_MIN_S or row.share >= FLAG_MIN_SHARE
    if not matters or not row.status:
        return ""
    if row.bound_s is None:
        return "no bound (symbolic shapes roller did not plan)"
    if row.over_bound < FLAG_RATIO:
        return ""
    return f"{row.over_bound:.0f}x its {row.bound_by} bound: " + "; ".join(
        _why(row, fork_join_s))


def _why(row: KernelRow, fork_join_s: float) -> List[str]:
    """What makes a kernel far from its bound, from its report entry and loop-nest facts."""
    if row.status == "fallback":
        return [f"left to TVM's default ({row.fallback}: {row.reason[:80]})"]
    facts = row.facts or {}
    why = []
    regions = facts.get("parallel_regions", 0)
    if regions and row.bound_s < 10 * regions * fork_join_s:
        why.append(f"small: a {row.bound_s * 1e6:.1f} us bound against {regions} parallel "
                   f"region(s) at {fork_join_s * 1e6:.1f} us each (fork/join, measured)")
    if not regions:
        why.append("serial: no parallel loop")
    elif facts.get("parallel_extent", 0) == 1:
        why.append("serial: a parallel loop of extent 1")
    if not facts.get("vector_lanes"):
        why.append("scalar: no vector loop")
    for buf, step in sorted(facts.get("strided", {}).items()):
        why.append(f"strided: the innermost loop steps {step} elements through {buf}")
    for buf in facts.get("gathers", []):
        why.append(f"gather: {buf} read through an index tensor")
    arith_s = facts.get("arith_s") or 0.0
    if arith_s >= ARITH_SHARE * row.measured_s / row.invocations:
        why.append(f"arithmetic: {facts['arith_ops']:.3g} operations need >= "
                   f"{arith_s * 1e6:.0f} us at the peak (the bound counts only the "
                   "multiply-adds of reductions)")
    if not why:
        pred = row.predicted_s
        why.append("unexplained: none of the loop-nest causes; roller predicted "
                   + ("nothing" if pred is None else
                      f"{pred * 1e6:.0f} us ({pred / row.bound_s:.1f}x the bound)")
                   + ": the model misses what this kernel does")
    return why


def format_profile(rows: List[KernelRow], top: int = 25) -> str:
    """A table of the ``top`` slowest kernels and every flagged one, then the totals."""
    total = sum(r.measured_s for r in rows)
    shown = [r for i, r in enumerate(rows) if i < top or r.flag]
    lines = [f"{'kernel':<56} {'ms':>8} {'calls':>5} {'share':>6} {'bound ms':>9} {'by':>7} "
             f"{'x bound':>8} {'pred ms':>8}  flag"]
    for r in shown:
        lines.append(
            f"{r.name[:56]:<56} {r.measured_s * 1e3:8.3f} {r.invocations:5d} {r.share:6.1%} "
            f"{_ms(r.bound_s):>9} {r.bound_by[:7]:>7} "
            f"{'-' if r.over_bound is None else f'{r.over_bound:.1f}':>8} "
            f"{_ms(r.predicted_s):>8}  {r.flag or ('(VM builtin)' if not r.status else '')}")
    flagged = [r for r in rows if r.flag]
    kernels = [r for r in rows if r.status]
    bounded = sum(r.bound_s or 0.0 for r in kernels)
    lines.append(f"all kernels {total * 1e3:.3f} ms per call ({len(kernels)} PrimFuncs, "
                 f"{sum(r.measured_s for r in rows if not r.status) * 1e3:.3f} ms in VM "
                 f"builtins); sum of bounds {bounded * 1e3:.3f} ms; {len(flagged)} flagged "
                 f"(>= {FLAG_RATIO:g}x bound and >= {FLAG_MIN_S * 1e6:.0f} us or "
                 f">= {FLAG_MIN_SHARE:.0%})")
    return "\n".join(lines)


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"
