"""The shared MetaSchedule-tuned baselines: the "tuned search" peer.

``shared/baselines/metaschedule-llvm-avx512`` (beside the repository, or ``$TVM_ROLLER_BASELINES``)
holds MetaSchedule's best record for shape index 1 of every class, tuned with 192 trials on a
2-core AVX-512 machine for ``{"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}``, and
``tuning_times.jsonl`` with each tuning's wall time (``tune_s``: the search-time peer for roller's
construction time).

The tuned trace is replayed on the unscheduled workload and compiled with the *same* target as
roller's kernel (the host's mcpu), so both kernels get the same code generator; the schedule
itself still carries its skylake-avx512 tile sizes. On a host without AVX-512 the comparison is
skipped with a reason.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from tvm_roller.suite import workloads

if TYPE_CHECKING:  # pragma: no cover
    import tvm
    from tvm.s_tir import Schedule

ENV_VAR = "TVM_ROLLER_BASELINES"
DIR_NAME = "metaschedule-llvm-avx512"
BASELINE_TARGET = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
COMPILE_NOTE = ("MS-tuned trace (tuned for mcpu=skylake-avx512) replayed and compiled for the "
                "same target as roller")


def candidate_dirs() -> List[Path]:
    """Where the database may be, in order: the env var, ``../shared/baselines`` relative to the
    repository (a source checkout / editable install), then relative to the working directory."""
    out: List[Path] = []
    env = os.environ.get(ENV_VAR)
    if env:
        out.append(Path(env))
    repo = Path(__file__).resolve().parents[2]
    out.append(repo.parent / "shared" / "baselines" / DIR_NAME)
    cwd = Path.cwd()
    out.append(cwd.parent / "shared" / "baselines" / DIR_NAME)
    out.append(cwd / "shared" / "baselines" / DIR_NAME)
    return out


def find_dir() -> Optional[Path]:
    for d in candidate_dirs():
        if (d / "database_workload.json").is_file() and (d / "database_tuning_record.json").is_file():
            return d
    return None


def host_has_avx512() -> bool:
    """The tuned schedules vectorize for 512-bit registers; without AVX-512F they don't apply."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return "avx512f" in line.split()
    except OSError:
        return False
    return False


def skip_reason(target: "tvm.target.Target") -> Optional[str]:
    """Why the MetaSchedule peer can't be used with ``target`` here, or None when it can."""
    if target.kind.name != "llvm":
        return f"MS baselines are CPU (llvm) schedules; target is {target.kind.name}"
    if not host_has_avx512():
        return "host CPU lacks AVX-512; the tuned schedules are for skylake-avx512"
    if find_dir() is None:
        tried = ", ".join(str(d) for d in candidate_dirs())
        return f"MetaSchedule baseline database not found (tried {tried}; set ${ENV_VAR})"
    return None


@functools.lru_cache(maxsize=4)
def _load(dir_path: str) -> Tuple[object, Dict[Tuple[str, int], dict]]:
    """Load the JSON database once (it is read-only) plus tuning_times.jsonl."""
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=dir_path, allow_missing=False)
    times: Dict[Tuple[str, int], dict] = {}
    tt = Path(dir_path) / "tuning_times.jsonl"
    if tt.is_file():
        for line in tt.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                times[(rec["op"], int(rec["idx"]))] = rec
    return db, times


def database(dir_path: Optional[Path] = None):
    """The loaded ``ms.database.JSONDatabase`` (FileNotFoundError when absent)."""
    d = dir_path or find_dir()
    if d is None:
        raise FileNotFoundError(f"MetaSchedule baselines not found; tried "
                                f"{', '.join(map(str, candidate_dirs()))}")
    return _load(str(d))[0]


def tuned_schedule(cls: str, idx: int, target: "tvm.target.Target | dict | str",
                   dir_path: Optional[Path] = None) -> Optional["Schedule"]:
    """MetaSchedule's best schedule for ``cls:idx`` replayed on the unscheduled workload, or None
    where the database has no record (only shape index 1 was tuned)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    mod = tvm.IRModule({"main": workloads.create(cls, idx)})
    return ms.tir_integration.compile_tir(database(dir_path), mod, tgt)


def tuning_record(cls: str, idx: int, dir_path: Optional[Path] = None) -> Optional[dict]:
    """The tuning_times.jsonl line for ``cls:idx`` (op, idx, trials, tune_s, best_s) or None."""
    d = dir_path or find_dir()
    if d is None:
        return None
    return _load(str(d))[1].get((cls, idx))


def tune_seconds(cls: str, idx: int, dir_path: Optional[Path] = None) -> Optional[float]:
    rec = tuning_record(cls, idx, dir_path)
    return None if rec is None else float(rec["tune_s"])
