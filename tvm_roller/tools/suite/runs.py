"""Stored suite runs: one run's roller / PyTorch times per workload and the machine it ran on.

A stored run is a JSON file (``tvm-roller suite --save-run FILE``) that a later run compares
itself with (``--compare-to FILE``, see ``compare``). Per workload it keeps the median over the
run's rounds (each round: roller's kernel timed, then PyTorch's, in the same process) of roller's
time, PyTorch's time and of the rounds' ratios torch / roller (> 1: roller faster), plus every
round's times. Around them: the machine class (CPU model name and CPU count: ratios are only
comparable on the same class), the target, the date, the git commit and tvm-roller's version.

Runs for this project's machines are shipped in ``data/runs/<machine slug>.json``
(``--compare-to shipped`` picks the one of this machine's class). No TVM import here.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

FORMAT = "tvm-roller-suite-run/1"
MIN_ROUNDS = 3  # a stored ratio is a median: fewer rounds leave one noisy timing deciding it
SHIPPED = "shipped"  # --compare-to's name for this machine's run in DATA_DIR
DATA_DIR = Path(__file__).resolve().parent / "data" / "runs"
PROC_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class MachineClass:
    """What makes two runs' ratios comparable: the same CPU model and CPU count."""
    cpu_model: str
    cpus: int

    def slug(self) -> str:
        """A file name for this class: 'intel-r-xeon-r-processor-2cpu'."""
        name = re.sub(r"[^a-z0-9]+", "-", self.cpu_model.lower()).strip("-") or "unknown-cpu"
        return f"{name}-{self.cpus}cpu"


@dataclass
class WorkloadTiming:
    """One workload of a run; times in seconds, None where not measured (a failure)."""
    ok: bool
    roller_s: Optional[float]
    torch_s: Optional[float]
    ratio: Optional[float]  # median of the rounds' torch / roller: > 1 means roller faster
    roller_runs_s: List[float] = field(default_factory=list)
    torch_runs_s: List[float] = field(default_factory=list)
    error: Optional[str] = None
    load_avg: Optional[float] = None  # 1-minute load before the workload: was the box busy?
    plan: Optional[str] = None  # digest of roller's scheduled TIR (runner.plan_digest)
    foreign_cpu: Optional[float] = None  # share of all CPUs other processes used meanwhile


@dataclass
class SuiteRun:
    machine: MachineClass
    target: str
    date: str  # ISO 8601, UTC
    git_commit: Optional[str]
    git_dirty: Optional[bool]  # uncommitted changes to tracked files when the run was made
    version: str  # tvm-roller's
    rounds: int
    repeat: int  # time_evaluator repeats per round
    workloads: Dict[str, WorkloadTiming]


# -- the machine and the tree ------------------------------------------------------------------
def cpu_model_name(cpuinfo: Optional[str]) -> str:
    """The first 'model name' of /proc/cpuinfo text; else the platform's processor string."""
    for line in (cpuinfo or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name" and value.strip():
            return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown"


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use, not the box's total
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def host_machine() -> MachineClass:
    try:
        text: Optional[str] = PROC_CPUINFO.read_text()
    except OSError:  # not Linux
        text = None
    return MachineClass(cpu_model_name(text), _cpus())


def _git(*args: str) -> Optional[str]:
    try:
        res = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):  # no git, or a hung one: the field stays None
        return None
    return res.stdout if res.returncode == 0 else None


def git_state() -> Tuple[Optional[str], Optional[bool]]:
    """(HEAD's commit, whether tracked files differ from it); (None, None) outside a checkout."""
    head = _git("rev-parse", "HEAD")
    if head is None:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return head.strip(), (None if status is None else bool(status.strip()))


# -- from the runner's records -----------------------------------------------------------------
def _median(xs: Sequence[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x]
    return float(statistics.median(vals)) if vals else None


def workload_timing(rec: Dict[str, Any]) -> WorkloadTiming:
    """One runner record (``runner.run_workload``) as a stored workload."""
    roller = [float(x) for x in rec.get("latency_runs_s") or [] if x]
    torch = [float(x) for x in rec.get("torch_runs_s") or [] if x]
    ok = bool(rec.get("ok"))
    ratio = _median([t / r for r, t in zip(roller, torch)]) if ok else None
    return WorkloadTiming(ok=ok, roller_s=_median(roller), torch_s=_median(torch), ratio=ratio,
                          roller_runs_s=roller, torch_runs_s=torch, error=rec.get("error"),
                          load_avg=rec.get("load_avg"), plan=rec.get("plan"),
                          foreign_cpu=rec.get("foreign_cpu"))


def make_run(records: Sequence[Dict[str, Any]], target: str, rounds: int,
             repeat: int) -> SuiteRun:
    from tvm_roller.core.version import __version__

    commit, dirty = git_state()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return SuiteRun(machine=host_machine(), target=target, date=date, git_commit=commit,
                    git_dirty=dirty, version=__version__, rounds=rounds, repeat=repeat,
                    workloads={r["workload"]: workload_timing(r) for r in records})


# -- files -------------------------------------------------------------------------------------
def to_dict(run: SuiteRun) -> Dict[str, Any]:
    return {"format": FORMAT, **asdict(run)}


def from_dict(d: Dict[str, Any], source: str = "<dict>") -> SuiteRun:
    """A run from its JSON form; ValueError naming ``source`` on anything else."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ValueError(f"{source} is not a stored suite run (format {FORMAT!r} expected; "
                         f"write one with `tvm-roller suite --save-run FILE`)")
    try:
        fields = {k: v for k, v in d.items() if k not in ("format", "machine", "workloads")}
        return SuiteRun(machine=MachineClass(**d["machine"]),
                        workloads={k: WorkloadTiming(**v) for k, v in d["workloads"].items()},
                        **fields)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{source}: malformed stored suite run: {e}") from None


def save_run(run: SuiteRun, path: str | os.PathLike) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(to_dict(run), indent=1) + "\n", encoding="utf-8")
    return p


def shipped_path(machine: MachineClass) -> Path:
    return DATA_DIR / f"{machine.slug()}.json"


def resolve_path(spec: str | os.PathLike) -> Path:
    """A --compare-to argument: a file, or ``shipped`` for this machine class's shipped run."""
    if str(spec) != SHIPPED:
        return Path(spec)
    p = shipped_path(host_machine())
    if not p.is_file():
        have = sorted(q.stem for q in DATA_DIR.glob("*.json")) or ["none"]
        raise ValueError(f"no shipped run for this machine class ({p.name}); shipped: "
                         f"{', '.join(have)}")
    return p


def load_run(path: str | os.PathLike) -> SuiteRun:
    """A stored run; OSError when unreadable, ValueError when not a stored run."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p} is not JSON: {e}") from None
    return from_dict(data, str(p))
