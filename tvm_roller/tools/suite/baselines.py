"""The MetaSchedule-tuned baselines: the "tuned search" peer.

A baseline database is a MetaSchedule ``JSONDatabase`` folder holding MetaSchedule's best record
for shape index 1 of every class, plus ``tuning_times.jsonl`` with each tuning's wall time
(``tune_s``: the search-time peer for roller's construction time). Where it is looked for, first
found wins (``candidates``):

1. ``$TVM_ROLLER_BASELINES`` (``"env"``);
2. the database re-tuned on this machine by ``python/tune_baselines.py`` for the suite's target
   (``"retuned"``): ``<cache_dir()>/baselines/metaschedule-llvm-<mcpu>-<N>c``, i.e.
   ``~/.cache/tvm-roller/baselines/...`` or under ``$TVM_ROLLER_CACHE``;
3. the records shipped in the package (``"shipped"``, ``tvm_roller/tools/suite/data/``), tuned with 192
   trials on a 2-core AVX-512 machine (Zen 4) for ``{"kind": "llvm", "mcpu": "skylake-avx512",
   "num-cores": 2}``;
4. ``shared/baselines`` beside the repository or the working directory (``"shared"``, the old place).

The tuned trace is replayed on the unscheduled workload and compiled with the *same* target as
roller's kernel (the host's mcpu), so both kernels get the same code generator; the schedule
itself still carries the tile sizes of the target it was tuned for (``tuning_times.jsonl`` lines
name it in ``target``; the shipped ones were tuned for skylake-avx512). Schedules tuned for an
AVX-512 CPU are skipped with a reason on a host without AVX-512.
"""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from tvm_roller.tools.suite import workloads

if TYPE_CHECKING:  # pragma: no cover
    import tvm
    from tvm.s_tir import Schedule

ENV_VAR = "TVM_ROLLER_BASELINES"
DIR_NAME = "metaschedule-llvm-avx512"
BASELINE_TARGET = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
COMPILE_NOTE = ("MS-tuned trace (tuned for mcpu=skylake-avx512) replayed and compiled for the "
                "same target as roller")
#: the records shipped as package data
SHIPPED_DIR = Path(__file__).resolve().parent / "data" / DIR_NAME
#: how a database's origin is named in the suite's output
SOURCE_LABELS = {
    "env": f"${ENV_VAR}",
    "retuned": "re-tuned on this machine",
    "shipped": "shipped with tvm-roller (tuned on a 2-core Zen 4, 192 trials)",
    "shared": "shared/baselines",
}

TargetLike = Any  # a tvm.target.Target, dict, JSON string or kind string


@dataclass(frozen=True)
class Source:
    """One place a baseline database may be: its kind (a ``SOURCE_LABELS`` key) and folder."""

    kind: str
    path: Path

    def exists(self) -> bool:
        return ((self.path / "database_workload.json").is_file()
                and (self.path / "database_tuning_record.json").is_file())

    def describe(self) -> str:
        return f"{SOURCE_LABELS.get(self.kind, self.kind)}: {self.path}"

    def as_dict(self) -> Dict[str, str]:
        return {"source": self.kind, "path": str(self.path)}


def _normalized(target: Optional[TargetLike]) -> "tvm.target.Target":
    """roller's normalized target (mcpu and num-cores filled in); the host CPU for None."""
    from tvm_roller.hardware import normalize_target

    return normalize_target({"kind": "llvm"} if target is None else target)


def retuned_name(target: Optional[TargetLike] = None) -> str:
    """Folder name of the database re-tuned for ``target`` (host CPU by default), keyed by the
    target's mcpu and core count: ``metaschedule-llvm-znver4-2c``."""
    tgt = _normalized(target)
    mcpu = str(tgt.attrs.get("mcpu", "") or "generic")
    cores = tgt.attrs.get("num-cores")
    raw = f"metaschedule-{tgt.kind.name}-{mcpu}" + (f"-{int(cores)}c" if cores else "")
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)


def retuned_dir(target: Optional[TargetLike] = None) -> Path:
    """Where ``python/tune_baselines.py`` writes (and the suite looks for) the database re-tuned
    on this machine for ``target``: ``<cache_dir()>/baselines/<retuned_name(target)>``."""
    from tvm_roller.hardware import cache_dir

    return cache_dir() / "baselines" / retuned_name(target)


def candidates(target: Optional[TargetLike] = None) -> List[Source]:
    """Where the database may be, in search order (see the module docstring). ``target`` is the
    suite's target (host CPU by default); the re-tuned place is only looked at for llvm."""
    out: List[Source] = []
    env = os.environ.get(ENV_VAR)
    if env:
        out.append(Source("env", Path(env).expanduser()))
    try:
        if _normalized(target).kind.name == "llvm":
            out.append(Source("retuned", retuned_dir(target)))
    except (ValueError, RuntimeError, TypeError):  # a target TVM cannot parse: no re-tuned place
        pass
    out.append(Source("shipped", SHIPPED_DIR))
    repo = Path(__file__).resolve().parents[2]
    cwd = Path.cwd()
    for d in (repo.parent / "shared" / "baselines" / DIR_NAME,
              cwd.parent / "shared" / "baselines" / DIR_NAME,
              cwd / "shared" / "baselines" / DIR_NAME):
        if all(d != s.path for s in out):
            out.append(Source("shared", d))
    return out


def candidate_dirs(target: Optional[TargetLike] = None) -> List[Path]:
    return [s.path for s in candidates(target)]


def find(target: Optional[TargetLike] = None) -> Optional[Source]:
    """The first candidate that holds a database, or None."""
    for s in candidates(target):
        if s.exists():
            return s
    return None


def find_dir(target: Optional[TargetLike] = None) -> Optional[Path]:
    s = find(target)
    return None if s is None else s.path


def database_target(dir_path: Path) -> Dict[str, Any]:
    """The target the database in ``dir_path`` was tuned for: the ``target`` of its
    tuning_times.jsonl lines (written by the re-tune tool), else the shipped one's."""
    for rec in _times(str(dir_path)).values():
        if isinstance(rec.get("target"), dict):
            return dict(rec["target"])
    return dict(BASELINE_TARGET)


def _is_avx512(tuned_for: Dict[str, Any]) -> bool:
    import tvm

    mcpu = str(tuned_for.get("mcpu", ""))
    try:
        feats = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(
            tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))}
        return "avx512f" in feats
    except (RuntimeError, ValueError, TypeError, AttributeError):
        return "avx512" in mcpu


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
    src = find(target)
    if src is None:
        tried = ", ".join(str(d) for d in candidate_dirs(target))
        return (f"MetaSchedule baseline database not found (tried {tried}; set ${ENV_VAR} or "
                f"run python/tune_baselines.py)")
    tuned_for = database_target(src.path)
    if _is_avx512(tuned_for) and not host_has_avx512():
        return (f"host CPU lacks AVX-512; the tuned schedules ({src.describe()}) are for "
                f"mcpu={tuned_for.get('mcpu')} (re-tune here with python/tune_baselines.py)")
    return None


def compile_note(target: Optional[TargetLike] = None) -> str:
    """What the suite's MS column is: which database (kind and path), tuned for which mcpu."""
    src = find(target)
    if src is None:
        return COMPILE_NOTE
    mcpu = database_target(src.path).get("mcpu", "?")
    return (f"MS-tuned trace (tuned for mcpu={mcpu}) replayed and compiled for the same target "
            f"as roller; database {src.describe()}")


def source_info(target: Optional[TargetLike] = None) -> Optional[Dict[str, Any]]:
    """``{"source": "shipped"|"retuned"|"env"|"shared", "path": ..., "tuned_for": {...}}`` of the
    database the suite uses for ``target``, or None when there is none."""
    src = find(target)
    if src is None:
        return None
    return {**src.as_dict(), "tuned_for": database_target(src.path)}


@functools.lru_cache(maxsize=8)
def _times(dir_path: str) -> Dict[Tuple[str, int], dict]:
    times: Dict[Tuple[str, int], dict] = {}
    tt = Path(dir_path) / "tuning_times.jsonl"
    if tt.is_file():
        for line in tt.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                times[(rec["op"], int(rec["idx"]))] = rec
    return times


@functools.lru_cache(maxsize=4)
def _load(dir_path: str) -> Tuple[object, Dict[Tuple[str, int], dict]]:
    """Load the JSON database once (it is read-only) plus tuning_times.jsonl."""
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=dir_path, allow_missing=False)
    return db, _times(dir_path)


def clear_cache() -> None:
    """Forget loaded databases (after one was rewritten in this process)."""
    _load.cache_clear()
    _times.cache_clear()


def database(dir_path: Optional[Path] = None, target: Optional[TargetLike] = None):
    """The loaded ``ms.database.JSONDatabase`` in ``dir_path``, else the one ``find(target)``
    picks (FileNotFoundError when there is none)."""
    d = dir_path or find_dir(target)
    if d is None:
        raise FileNotFoundError(f"MetaSchedule baselines not found; tried "
                                f"{', '.join(map(str, candidate_dirs(target)))}")
    return _load(str(d))[0]


def tuned_schedule(cls: str, idx: int, target: "tvm.target.Target | dict | str",
                   dir_path: Optional[Path] = None) -> Optional["Schedule"]:
    """MetaSchedule's best schedule for ``cls:idx`` replayed on the unscheduled workload, or None
    where the database has no record (only shape index 1 was tuned). The database is
    ``dir_path``, else the one the search order picks for ``target``."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    mod = tvm.IRModule({"main": workloads.create(cls, idx)})
    return ms.tir_integration.compile_tir(database(dir_path, tgt), mod, tgt)


def tuning_record(cls: str, idx: int, dir_path: Optional[Path] = None,
                  target: Optional[TargetLike] = None) -> Optional[dict]:
    """The tuning_times.jsonl line for ``cls:idx`` (op, idx, trials, tune_s, best_s; re-tuned
    databases add target and date) or None."""
    d = dir_path or find_dir(target)
    if d is None:
        return None
    return _times(str(d)).get((cls, idx))


def tune_seconds(cls: str, idx: int, dir_path: Optional[Path] = None,
                 target: Optional[TargetLike] = None) -> Optional[float]:
    rec = tuning_record(cls, idx, dir_path, target)
    return None if rec is None else float(rec["tune_s"])
