"""Compare a suite run with a stored one: each workload's ratio to PyTorch, now against then.

Pure functions on ``runs.SuiteRun`` records (no TVM, no timing). Ratios, not times, are compared:
torch / roller timed alternately in one process cancels a machine that is uniformly slower or
faster, not one whose other processes take a core (see ``quiet``). A workload is flagged when its ratio fell by more than 15% (``now < 0.85 x stored``) or
when it failed now after passing then. A row notes "plan changed" when roller scheduled a
different kernel (the runs' plan digests differ): a changed ratio then has a cause in the code or
the device model, not only in the machine's state; and when other processes used more than 10% of
the CPUs while a run timed the workload (a 2-thread PyTorch peer slows by up to 100x then). Runs
are comparable only on one machine class and target: ``mismatch`` says why not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from tvm_roller.tools.suite.quiet import BUSY_SHARE
from tvm_roller.tools.suite.runs import MachineClass, SuiteRun, WorkloadTiming

THRESHOLD = 0.85  # flag ratio_now < THRESHOLD * ratio_stored

# Row.flag values: empty when nothing is wrong.
SLOWER = "SLOWER"
FAILED = "FAILED"  # passed in the stored run, fails now


@dataclass(frozen=True)
class Row:
    workload: str
    stored: Optional[float]  # the stored run's ratio torch / roller
    now: Optional[float]
    change: Optional[float]  # now / stored: < 1 means roller lost ground to PyTorch
    flag: str
    note: str = ""  # why a ratio is missing; "plan changed": roller scheduled another kernel


@dataclass(frozen=True)
class Comparison:
    rows: List[Row]
    class_geomean: Dict[str, Optional[float]]  # the geomean of ``change`` per class
    geomean: Optional[float]  # over every compared workload
    not_run: List[str]  # in the stored run, not in this one
    threshold: float

    @property
    def flagged(self) -> List[Row]:
        return [r for r in self.rows if r.flag]


def mismatch(stored: SuiteRun, machine: MachineClass, target: Optional[str]) -> Optional[str]:
    """Why ``stored`` cannot be compared with a run on ``machine`` / ``target``; None if it can."""
    diffs = []
    if stored.machine.cpu_model != machine.cpu_model:
        diffs.append(f"CPU model {stored.machine.cpu_model!r} (stored) vs "
                     f"{machine.cpu_model!r} (here)")
    if stored.machine.cpus != machine.cpus:
        diffs.append(f"{stored.machine.cpus} CPUs (stored) vs {machine.cpus} (here)")
    if target is not None and stored.target != target:
        diffs.append(f"target {stored.target} (stored) vs {target} (now)")
    return "; ".join(diffs) if diffs else None


def _geomean(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _which_moved(then: WorkloadTiming, now: WorkloadTiming) -> str:
    """A flagged ratio's two sides, now / stored: roller slower, or PyTorch faster? (Run to run
    on a shared 2-vCPU machine PyTorch's 2-thread kernels move far more than roller's.)"""
    def times(a: Optional[float], b: Optional[float]) -> str:
        return f"x{b / a:.2f}" if a and b else "-"

    return (f"time now / stored: roller {times(then.roller_s, now.roller_s)}, "
            f"torch {times(then.torch_s, now.torch_s)}")


def _row(name: str, then: Optional[WorkloadTiming], now: WorkloadTiming, threshold: float) -> Row:
    if then is None:
        return Row(name, None, now.ratio, None, "", "not in the stored run")
    if not now.ok and then.ok:
        return Row(name, then.ratio, None, None, FAILED, now.error or "failed now")
    if then.ratio is None or now.ratio is None:
        note = "failed in both runs" if not (now.ok or then.ok) else "no ratio in one run"
        return Row(name, then.ratio, now.ratio, None, "", note)
    change = now.ratio / then.ratio
    notes = []
    if then.plan is not None and now.plan is not None and then.plan != now.plan:
        notes.append("plan changed")
    if change < threshold:
        notes.append(_which_moved(then, now))
    for run, wl in (("stored", then), ("now", now)):
        if wl.foreign_cpu is not None and wl.foreign_cpu > BUSY_SHARE:
            notes.append(f"{run}: other processes used {100 * wl.foreign_cpu:.0f}% of the CPUs")
    return Row(name, then.ratio, now.ratio, change, SLOWER if change < threshold else "",
               "; ".join(notes))


def compare_runs(stored: SuiteRun, now: SuiteRun, threshold: float = THRESHOLD) -> Comparison:
    """Every workload of ``now`` against ``stored`` (workloads only stored are listed as not run:
    a run over some of the suite's workloads is not a regression in the others)."""
    rows = [_row(name, stored.workloads.get(name), wl, threshold)
            for name, wl in now.workloads.items()]
    by_class: Dict[str, List[float]] = {}
    for r in rows:
        by_class.setdefault(r.workload.split(":")[0], [])
        if r.change is not None:
            by_class[r.workload.split(":")[0]].append(r.change)
    changes = [r.change for r in rows if r.change is not None]
    return Comparison(rows=rows, class_geomean={c: _geomean(v) for c, v in by_class.items()},
                      geomean=_geomean(changes),
                      not_run=[n for n in stored.workloads if n not in now.workloads],
                      threshold=threshold)


def _f(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_comparison(c: Comparison, stored: SuiteRun) -> str:
    commit = (stored.git_commit or "unknown commit")[:10] + (" (dirty)" if stored.git_dirty else "")
    lines = [f"compared with the run of {stored.date} at {commit}, tvm-roller {stored.version}, "
             f"{stored.rounds} rounds; ratio = torch / roller (> 1: roller faster), change = "
             f"now / stored, flagged below {c.threshold:.2f}",
             f"{'workload':<8}  {'stored':>7}  {'now':>7}  {'change':>7}  flag"]
    for r in c.rows:
        tail = r.flag + (f" ({r.note})" if r.note else "")
        lines.append(f"{r.workload:<8}  {_f(r.stored, '.3f'):>7}  {_f(r.now, '.3f'):>7}  "
                     f"{_f(r.change, '.3f'):>7}  {tail}".rstrip())
    per_class = ", ".join(f"{k} {_f(v, '.3f')}" for k, v in c.class_geomean.items())
    lines.append(f"geomean change per class: {per_class}")
    lines.append(f"geomean change: {_f(c.geomean, '.3f')} over "
                 f"{sum(1 for r in c.rows if r.change is not None)} workloads; "
                 f"{len(c.flagged)} flagged"
                 + (f": {', '.join(r.workload for r in c.flagged)}" if c.flagged else ""))
    if c.not_run:
        lines.append(f"{len(c.not_run)} stored workloads not run now")
    return "\n".join(lines)
