"""Re-tune the MetaSchedule baselines on the machine at hand, so the suite's "tuned search" peer is
tuned where it is measured.

For each workload (default: shape index 1 of all 13 classes, as the shipped records), one
``ms.tune_tir`` run with MetaSchedule's defaults (local runner, XGBoost cost model, evolutionary
search; the local builder with a build function that skips the tensor-intrinsic import) and ``max_trials_global=trials`` (192 by default, ``num_trials_per_iter`` 32)
into a temporary work dir; only its best record is kept. The output folder gets a fresh
``JSONDatabase`` (``database_workload.json``, ``database_tuning_record.json``: one record per
workload) and ``tuning_times.jsonl`` (``op``, ``idx``, ``trials``, ``tune_s``, ``best_s``,
``target``, ``date``). Records already there for workloads not re-tuned now are kept, so
``--ops`` can add to or refresh one workload of an earlier run. The output is written after every
workload (an interrupted run keeps what it finished).

The default output folder is ``baselines.retuned_dir(target)``
(``~/.cache/tvm-roller/baselines/metaschedule-llvm-<mcpu>-<N>c``), which the suite prefers to the
shipped records for that target. Each workload takes 42 s to 21 minutes on 2 cores at 192 trials
(the shipped 13 took 74 minutes); don't run other benchmarks meanwhile.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, TextIO, Tuple

from tvm_roller.hardware.threads import size_thread_pool
from tvm_roller.tools.suite import baselines, runner, workloads

if TYPE_CHECKING:  # pragma: no cover
    import tvm

DEFAULT_TRIALS = 192
DEFAULT_PER_ITER = 32
DEFAULT_IDX = 1  # the shape index the baselines use
_FILES = ("database_workload.json", "database_tuning_record.json", "tuning_times.jsonl")


def parse_ops(ops: Optional[str | Sequence[str]] = None) -> List[Tuple[str, int]]:
    """``CLASS[:INDEX]`` list; a bare class means shape index 1 (not all four shapes, as in the
    suite: each tuning takes minutes). None / empty: index 1 of all 13 classes."""
    if ops is None:
        return [(c, DEFAULT_IDX) for c in workloads.CLASSES]
    items = ops.split(",") if isinstance(ops, str) else [i for o in ops for i in str(o).split(",")]
    if not any(i.strip() for i in items):
        return [(c, DEFAULT_IDX) for c in workloads.CLASSES]
    spec = [i if (":" in i or not i.strip()) else f"{i.strip()}:{DEFAULT_IDX}" for i in items]
    return workloads.list_workloads(",".join(spec))  # ValueError with the valid list


def target_dict(target: "tvm.target.Target") -> Dict[str, Any]:
    """The target as a JSON dict without TVM's defaults (tag, keys)."""
    d = json.loads(str(target))
    return {k: v for k, v in d.items() if k not in ("tag", "keys")}


def _quiet_metaschedule() -> None:
    # MetaSchedule logs every trial to the console at INFO and each tune_tir call resets its
    # logger; the log files in the work dir keep everything.
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)


def _structural_equal(a: Any, b: Any) -> bool:
    import tvm_ffi  # TVM 0.27: structural_equal lives in tvm_ffi

    return bool(tvm_ffi.structural_equal(a, b))


def _read_times(path: Path) -> List[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def write_records(out_dir: Path, new: Sequence[Tuple["tvm.IRModule", Any, dict]]) -> None:
    """Write ``out_dir`` afresh: the records already there for other workloads, then each
    ``(mod, best TuningRecord, tuning_times line)`` of ``new`` (one record per workload)."""
    from tvm.s_tir import meta_schedule as ms

    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir))
    try:
        db = ms.database.JSONDatabase(work_dir=str(staging))
        mods = [m for m, _, _ in new]
        if all((out_dir / f).is_file() for f in _FILES[:2]):
            old = ms.database.JSONDatabase(work_dir=str(out_dir), allow_missing=False)
            for rec in old.get_all_tuning_records():
                if any(_structural_equal(rec.workload.mod, m) for m in mods):
                    continue  # re-tuned now: replaced below
                wl = db.commit_workload(rec.workload.mod)
                db.commit_tuning_record(ms.database.TuningRecord(
                    rec.trace, wl, rec.run_secs, rec.target, rec.args_info))
        for mod, best, _ in new:
            wl = db.commit_workload(mod)
            db.commit_tuning_record(ms.database.TuningRecord(
                best.trace, wl, best.run_secs, best.target, best.args_info))
        done = {(line["op"], int(line["idx"])) for _, _, line in new}
        times = [t for t in _read_times(out_dir / _FILES[2]) if (t["op"], int(t["idx"])) not in done]
        times += [line for _, _, line in new]
        (staging / _FILES[2]).write_text("".join(json.dumps(t) + "\n" for t in times),
                                         encoding="utf-8")
        for f in _FILES:
            os.replace(staging / f, out_dir / f)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    baselines.clear_cache()


def builder() -> Any:
    """MetaSchedule's LocalBuilder with roller's build function: the default one imports every
    tensor intrinsic (~35 s) in each fresh worker, which exceeds the builder's 30 s timeout on a
    busy 2-core machine and fails every trial. Same compiled code for these untensorized CPU
    schedules; everything else (runner, cost model, search) stays MetaSchedule's default."""
    from tvm_roller.integrations.meta_schedule import default_builder

    return default_builder()


def tune_one(cls: str, idx: int, target: "tvm.target.Target", trials: int = DEFAULT_TRIALS,
             per_iter: int = DEFAULT_PER_ITER, seed: Optional[int] = None,
             work_dir: Optional[str | os.PathLike] = None) -> Tuple["tvm.IRModule", Any, dict]:
    """Tune ``cls:idx`` with ``ms.tune_tir`` into a temporary work dir (or ``work_dir``, kept);
    returns the module, its best TuningRecord and the tuning_times line. RuntimeError when no
    trial produced a valid record."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    # Exactly the module baselines.tuned_schedule queries (the database keys on structure).
    mod = tvm.IRModule({"main": workloads.create(cls, idx)})
    tmp = None
    if work_dir is None:
        tmp = tempfile.mkdtemp(prefix=f"tvm-roller-ms-{cls}{idx}-")
        wd = tmp
    else:
        wd = str(Path(work_dir) / f"{cls}{idx}")
    try:
        _quiet_metaschedule()
        t0 = time.perf_counter()
        db = ms.tune_tir(mod, target, wd, max_trials_global=trials,
                         num_trials_per_iter=per_iter, seed=seed, builder=builder())
        tune_s = time.perf_counter() - t0
        top = db.get_top_k(db.commit_workload(mod), 1)
        if not top:
            where = (f"see {wd}/logs" if tmp is None else
                     "re-run with --work-dir to keep MetaSchedule's logs")
            raise RuntimeError(f"{cls}:{idx}: MetaSchedule produced no valid record in "
                               f"{trials} trials ({where})")
        best = top[0]
        secs = [float(getattr(s, "value", s)) for s in (best.run_secs or [])]
        line = {"op": cls, "idx": idx, "trials": trials, "tune_s": tune_s,
                "best_s": sum(secs) / len(secs) if secs else None,
                "target": target_dict(target),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        return mod, best, line
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def tune_baselines(ops: Optional[str | Sequence[str]] = None, target: Any = None,
                   out_dir: Optional[str | os.PathLike] = None, trials: int = DEFAULT_TRIALS,
                   per_iter: int = DEFAULT_PER_ITER, seed: Optional[int] = None,
                   work_dir: Optional[str | os.PathLike] = None,
                   out: Optional[TextIO] = None) -> List[dict]:
    """Tune ``ops`` (``parse_ops``) for ``target`` (roller's normalized host target by default)
    and write the best record of each into ``out_dir`` (default ``baselines.retuned_dir(target)``,
    where the suite finds it). Returns the tuning_times lines written; a workload that fails is
    reported on ``out`` and skipped."""
    out = out or sys.stdout
    wls = parse_ops(ops)  # ValueError before any work
    if trials < 1 or per_iter < 1:
        raise ValueError("trials and per_iter must be positive")
    tgt = runner.resolve_target(target)
    if tgt.kind.name != "llvm":
        raise ValueError(f"the baselines are CPU (llvm) schedules; target is {tgt.kind.name}")
    dest = Path(out_dir) if out_dir is not None else baselines.retuned_dir(tgt)
    size_thread_pool()  # MetaSchedule's runs (no Context here) get every core, as roller's do
    print(f"tune_baselines: {len(wls)} workloads, {trials} trials each ({per_iter} per iter), "
          f"target {tgt}, into {dest}", file=out, flush=True)
    busy = runner._busy_warning()  # pylint: disable=protected-access
    if busy:
        print(busy, file=out, flush=True)
    lines: List[dict] = []
    for cls, idx in wls:
        try:
            mod, best, line = tune_one(cls, idx, tgt, trials, per_iter, seed, work_dir)
        except (RuntimeError, ValueError) as e:
            print(f"{cls}:{idx}: failed: {type(e).__name__}: {e}", file=out, flush=True)
            continue
        write_records(dest, [(mod, best, line)])
        lines.append(line)
        best_s = line["best_s"]
        print(f"{cls}:{idx}: {line['tune_s']:.0f} s, best "
              f"{'-' if best_s is None else f'{best_s * 1e3:.4f} ms'}", file=out, flush=True)
    total = sum(line["tune_s"] for line in lines)
    print(f"wrote {len(lines)} of {len(wls)} records to {dest} ({total:.0f} s tuning)",
          file=out, flush=True)
    return lines
