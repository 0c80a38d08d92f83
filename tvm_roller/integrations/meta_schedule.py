"""Roller's schedules as MetaSchedule tuning records.

``tune`` writes roller's top-k schedules of every PrimFunc it handles into a MetaSchedule
``JSONDatabase``, so TVM's own ``ms.tir_integration.compile_tir`` and
``relax.transform.MetaScheduleApplyDatabase`` use them unchanged. ``tune_seeded`` then runs
``ms.tune_tir`` (or ``tune_relax``) on that database: MetaSchedule's evolutionary search takes the
best measured records of a task into its initial population (``PickBestFromDatabase``, up to
``population_size * init_measured_ratio`` of them, replayed through the postprocessors), so
roller's schedules seed the search and ``MutateTileSize`` evolves their tile sizes (roller records
tile sizes as ``sample_perfect_tile`` decisions).

MetaSchedule ranks records by run time, so a predicted time must never compete with a measured
one. A database written with ``measure=False`` holds predicted times only; its work_dir carries a
``roller_database.json`` manifest saying ``"run_secs": "predicted"``, and ``tune`` refuses to add
measured records to it or predicted records to a measured one.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from tvm_roller.backends.registry import backend_for
from tvm_roller.cache.files import atomic_write
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.intrin_import import import_tensor_intrin
from tvm_roller.core.types import TargetLike
from tvm_roller.hardware import HOST_TARGET, DeviceModel, normalize_target
from tvm_roller.integrations.relax.pipeline import fusion_passes
from tvm_roller.planner import (Context, context_for, is_scheduled, schedule_candidates,
                                summarise)

logger = logging.getLogger(__name__)

MANIFEST = "roller_database.json"
PREDICTED = "predicted"
MEASURED = "measured"
_FORMAT = "tvm_roller.meta_schedule/1"
_RECORDS = "database_tuning_record.json"
# MetaSchedule's stand-in run time for a failed build or run (SortTuningRecordByMeanRunSecs)
_MS_FAILED_SECS = 1e10
# the runner opens tvm.runtime.device(device_type): a device name, not a target kind

ModLike = Union[tvm.IRModule, tirx.PrimFunc]


# -- tasks -----------------------------------------------------------------------------------------
@dataclass
class Task:
    """One PrimFunc to schedule: its name and the workload module MetaSchedule keys it by."""

    name: str
    workload: tvm.IRModule  # normalised exactly as compile_tir / TuneContext / ApplyDatabase do
    aliases: List[str] = field(default_factory=list)  # other functions with the same workload


def _normalize(func: tirx.PrimFunc) -> tvm.IRModule:
    # The very function MetaSchedule normalises with before every query and every tuning task
    # (IRModule({"main": f}) with global_symbol "main" when absent, plus tirx.noalias).
    return tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")(func)


def _is_relax(mod: tvm.IRModule) -> bool:
    return any(isinstance(f, relax.Function) for _, f in mod.functions_items())


def fused_module(mod: tvm.IRModule, target: Union[TargetLike, Context]) -> tvm.IRModule:
    """The Relax module after roller's fusion passes (as the Relax pipeline fuses for the
    context's options): its PrimFuncs are the tasks."""
    ctx = context_for(target)
    chains = ctx.fuse_chains and ctx.backend.traceable_chains
    with ctx.target:  # LegalizeOps picks target-specific legalizations
        return fusion_passes(ctx.fast_math, chains, ctx.device, None, ctx.conv_layouts)(mod)


def extract_tasks(mod: Union[ModLike, "relax.Function"],
                  target: Union[TargetLike, Context]) -> List[Task]:
    """The PrimFuncs of ``mod`` as tasks (for a Relax module: those of ``fusion_passes()(mod)``).

    Already-scheduled PrimFuncs are left out; functions with identical workloads share a task.
    """
    if isinstance(mod, relax.Function):
        mod = tvm.IRModule({"main": mod})
    if isinstance(mod, tirx.PrimFunc):
        items = [("main", mod)]
    elif isinstance(mod, tvm.IRModule):
        if _is_relax(mod):
            mod = fused_module(mod, target)
        items = [(gv.name_hint, f) for gv, f in mod.functions_items()
                 if isinstance(f, tirx.PrimFunc)]
        items.sort(key=lambda x: x[0])  # the order tune_tir uses
    else:
        raise UnsupportedError(f"expected a PrimFunc, an IRModule or a relax.Function, got "
                               f"{type(mod).__name__}")
    tasks: List[Task] = []
    for name, func in items:
        if is_scheduled(func):
            continue
        wl = _normalize(func)
        same = [t for t in tasks if tvm_ffi.structural_equal(t.workload, wl)]
        if same:
            same[0].aliases.append(name)
        else:
            tasks.append(Task(name, wl))
    if not tasks:
        raise UnsupportedError("no unscheduled PrimFunc to tune in the module")
    return tasks


# -- builder and runner ----------------------------------------------------------------------------
def build_without_tensor_intrin(mod: tvm.IRModule, target: tvm.target.Target,
                                _params: Optional[dict]) -> tvm.runtime.Module:
    """MetaSchedule's default build minus ``import tvm.s_tir.tensor_intrin``.

    The default ``f_build`` imports every tensor intrinsic (~30 s) in each fresh builder
    process, and LocalBuilder starts a new process pool per batch. Plain CPU schedules (roller's,
    and MetaSchedule's untensorized llvm ones) don't need them. Top level, so it pickles.
    """
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm.tirx.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod),
                          target=target)


def default_builder(timeout_sec: float = 60.0) -> ms.builder.LocalBuilder:
    return ms.builder.LocalBuilder(max_workers=1, timeout_sec=timeout_sec,
                                   f_build=build_without_tensor_intrin)


def default_runner(timeout_sec: float = 30.0) -> ms.runner.LocalRunner:
    # three 20 ms repeats: each candidate is timed for >= 60 ms in a separate process
    config = ms.runner.EvaluatorConfig(number=3, repeat=3, min_repeat_ms=20,
                                       enable_cpu_cache_flush=False)
    return ms.runner.LocalRunner(timeout_sec=timeout_sec, evaluator_config=config)


# -- search space: mutations that replay -----------------------------------------------------------
@derived_object
class ReplayCheckedMutator(ms.mutator.PyMutator):
    """A mutator that returns only traces which replay on the task's workload.

    TVM 0.27's evolutionary search replays each mutated trace without catching errors: one trace
    that no longer replays aborts the whole ``tune_tir`` run (``parallel_for_dynamic error``).
    MetaSchedule's own traces always replay, but a schedule whose instruction outputs depend on
    the tile sizes does not (e.g. ``get_loops`` after ``reverse_compute_at(...,
    preserve_unit_loops=False)`` returns fewer loops once a mutated tile makes a loop unit).
    This wrapper replays every mutation of ``inner`` and rejects the ones that fail, which the
    search then treats like any failed mutation (it retries).
    """

    def __init__(self, inner: ms.mutator.Mutator,
                 stats: Optional[Dict[str, int]] = None) -> None:
        self.inner = inner
        self.mod: Optional[tvm.IRModule] = None
        # shared with the clones MetaSchedule makes of the space generator
        self.stats = stats if stats is not None else {"mutated": 0, "rejected": 0}

    def _initialize_with_tune_context(self, context: ms.TuneContext) -> None:
        self.inner._initialize_with_tune_context(context)
        self.mod = context.mod

    def apply(self, trace: "tvm.s_tir.Trace", rand_state: int) -> Optional["tvm.s_tir.Trace"]:
        new = _ffi_mutator_apply(self.inner, trace, rand_state)
        if new is None:
            return None
        self.stats["mutated"] += 1
        try:
            new.apply_to_schedule(tvm.s_tir.Schedule(self.mod, error_render_level="none"),
                                  remove_postproc=True)
        except (RuntimeError, ValueError) as err:  # tvm.error.InternalError, ScheduleError
            self.stats["rejected"] += 1
            logger.debug("mutation rejected, it does not replay: %s", err)
            return None
        return new

    def clone(self) -> "ReplayCheckedMutator":
        return ReplayCheckedMutator(self.inner.clone(), self.stats)


def _ffi_mutator_apply(mutator: ms.mutator.Mutator, trace, rand_state: int):
    # Mutator.apply draws a fresh random seed; pass the search's per-thread state instead so
    # that a seeded tuning run stays reproducible.
    return tvm.get_global_func("s_tir.meta_schedule.MutatorApply")(mutator, trace, rand_state)


def search_space(stats: Optional[Dict[str, int]] = None,
                 target: Union[TargetLike, Context, None] = None
                 ) -> ms.space_generator.PostOrderApply:
    """MetaSchedule's default search space for ``target``'s backend (default: the host) with
    ``MutateTileSize`` replay-checked.

    Same schedule rules, postprocessors and mutator probabilities as the default; only the tile
    size mutations are checked (roller's traces carry no other mutable decision). Use it for a
    from-scratch baseline too, so both runs search the same space. ``stats`` (a dict) receives
    the counts of checked and rejected mutations.
    """
    probs = {}
    backend = target.backend if isinstance(target, Context) else \
        backend_for(normalize_target(HOST_TARGET if target is None else target))
    kind = backend.tuning_kind
    for mutator, prob in ms.Mutator.create(kind).items():
        if isinstance(mutator, ms.mutator.MutateTileSize):
            if stats is not None:
                stats.setdefault("mutated", 0)
                stats.setdefault("rejected", 0)
            mutator = ReplayCheckedMutator(mutator, stats)
        probs[mutator] = float(prob)
    return ms.space_generator.PostOrderApply(sch_rules="from-target", postprocs="from-target",
                                             mutator_probs=probs)


# -- work_dir, manifest and the record file --------------------------------------------------------
def _prepare_work_dir(work_dir: Union[str, os.PathLike]) -> str:
    work_dir = os.path.abspath(os.fspath(work_dir))
    parent = os.path.dirname(work_dir)
    if not os.path.isdir(parent):
        raise ValueError(f"the parent of work_dir {work_dir!r} does not exist")
    if os.path.exists(work_dir) and not os.path.isdir(work_dir):
        raise ValueError(f"work_dir {work_dir!r} exists and is not a directory")
    os.makedirs(work_dir, exist_ok=True)
    return work_dir


def read_manifest(work_dir: Union[str, os.PathLike]) -> Optional[Dict[str, Any]]:
    """The ``roller_database.json`` manifest of ``work_dir`` (None when there is none)."""
    path = os.path.join(os.fspath(work_dir), MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if data.get("format") != _FORMAT or data.get("run_secs") not in (PREDICTED, MEASURED):
        raise ValueError(f"{path} is not a tvm_roller database manifest")
    return data


def _write_manifest(work_dir: str, data: Dict[str, Any]) -> None:
    atomic_write(Path(work_dir) / MANIFEST, json.dumps(data, indent=1).encode("utf-8"))


def _count_lines(path: str) -> int:
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


@dataclass
class TrialRecord:
    """One line of ``database_tuning_record.json``, in commit (= trial) order."""

    index: int
    workload_index: int
    run_secs: List[float]
    signature: str  # the trace's instructions without decisions and postprocessing
    decisions: Dict[int, Any]  # instruction index -> decision

    @property
    def mean_s(self) -> float:
        """Mean run time; inf for a failed build/run (MetaSchedule stores 1e10)."""
        if not self.run_secs or any(s >= _MS_FAILED_SECS for s in self.run_secs):
            return math.inf
        return sum(self.run_secs) / len(self.run_secs)


def _trace_signature(trace_json: list) -> Tuple[str, Dict[int, Any]]:
    insts, decisions = trace_json
    cut = next((i for i, ins in enumerate(insts) if ins[0] == "EnterPostproc"), len(insts))
    return json.dumps(insts[:cut]), {int(i): d for i, d in decisions if int(i) < cut}


def trial_records(work_dir: Union[str, os.PathLike]) -> List[TrialRecord]:
    """The records of the JSON database in the order they were committed.

    ``JSONDatabase`` keeps records sorted by run time once loaded; the file keeps the commit order,
    which for a ``tune_tir`` run is the trial order.
    """
    out: List[TrialRecord] = []
    path = os.path.join(os.fspath(work_dir), _RECORDS)
    if not os.path.isfile(path):
        return out
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            wl_idx, (trace_json, run_secs, _target, _args) = json.loads(line)
            sig, dec = _trace_signature(trace_json)
            out.append(TrialRecord(len(out), int(wl_idx), [float(s) for s in run_secs or []],
                                   sig, dec))
    return out


def seed_descendants(work_dir: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    """Trials that MetaSchedule derived from roller's seed records by mutation.

    A trial descends from a seed when its trace has the seed's instructions (roller's loop nest:
    the same splits, cache_write, reorders, annotations) but other decisions, i.e. other
    ``sample_perfect_tile`` tile sizes. MetaSchedule's own design spaces never produce roller's
    instruction sequence, so such a trace can only come from mutating a seed.
    """
    man = read_manifest(work_dir)
    if man is None:
        raise ValueError(f"{work_dir} has no {MANIFEST}: not a roller database")
    recs = trial_records(work_dir)
    seed_lines = {s["line"] for s in man.get("seeds", [])}
    seeds = [recs[i] for i in sorted(seed_lines) if i < len(recs)]
    out = []
    for r in recs:
        if r.index in seed_lines:
            continue
        kin = [s for s in seeds if s.workload_index == r.workload_index
               and s.signature == r.signature]
        if not kin or any(s.decisions == r.decisions for s in kin):
            continue  # MetaSchedule's own sample, or a seed measured again unchanged
        # roller's top-k often share one loop structure: credit the closest seed
        def n_changed(s: TrialRecord) -> int:
            return sum(s.decisions.get(i) != d for i, d in r.decisions.items())

        s = min(kin, key=n_changed)
        changed = {i: (s.decisions.get(i), d) for i, d in r.decisions.items()
                   if s.decisions.get(i) != d}
        out.append({"trial": r.index, "seed": s.index, "mean_s": r.mean_s,
                    "seed_mean_s": s.mean_s, "changed": changed})
    return out


def _check_mixing(work_dir: str, kind: str, target: tvm.target.Target) -> Optional[Dict[str, Any]]:
    """Refuse to mix predicted and measured run times (or targets) in one database."""
    man = read_manifest(work_dir)
    n_records = _count_lines(os.path.join(work_dir, _RECORDS))
    if man is None:
        if n_records and kind == PREDICTED:
            raise ValueError(f"{work_dir} already holds {n_records} MetaSchedule records with "
                             "measured run times; predicted records would compete with them. "
                             "Write predicted records to their own work_dir, or use measure=True")
        return None
    if man["run_secs"] != kind:
        raise ValueError(f"{work_dir} holds roller records with {man['run_secs']} run times "
                         f"({MANIFEST}); refusing to add {kind} ones: MetaSchedule ranks records "
                         "by run time, so predicted and measured times must not compete")
    if man.get("target") is not None and man["target"] != _target_json(target):
        raise ValueError(f"{work_dir} holds records for target {man['target']}, not "
                         f"{_target_json(target)}: MetaSchedule does not filter records by target")
    return man


def _target_json(target: tvm.target.Target) -> Dict[str, Any]:
    return json.loads(str(target))  # a Target prints as its JSON config


# -- tune ------------------------------------------------------------------------------------------
@dataclass
class _Candidate:
    task: Task
    rank: int
    sch: Any  # tvm.s_tir.Schedule
    predicted_s: float


def _plan_candidates(tasks: Sequence[Task], ctx: Context, topk: int,
                     declined: List[Dict[str, str]], failed: List[Dict[str, Any]],
                     report: Optional[list]) -> List[_Candidate]:
    """Each task's top-k traceable schedules through the planner's one path
    (``schedule_candidates``: the size check, un-grouping, the report entry)."""
    cands: List[_Candidate] = []
    entries = []
    for task in tasks:
        res = schedule_candidates(task.workload["main"], ctx, task.name, topk)
        entries.append(res.entry)
        if not res.schedules:
            declined.append({"name": task.name, "reason": res.entry.reason})
            logger.warning("roller declined %s: %s", task.name, res.entry.reason)
        for rank, reason in res.failed:
            failed.append({"name": task.name, "rank": rank, "stage": "schedule",
                           "error": reason})
            logger.warning("roller's schedule #%d of %s failed: %s", rank, task.name, reason)
        cands += [_Candidate(task, c.rank, c.schedule, c.predicted_s) for c in res.schedules]
    summarise(entries)
    if report is not None:
        report.extend(e.to_dict() for e in entries)
    return cands


def _measure(cands: Sequence[_Candidate], target, builder, runner,
             failed: List[Dict[str, Any]]) -> List[Tuple[_Candidate, List[float]]]:
    """Build and run the candidates through MetaSchedule's builder and runner."""
    if not cands:
        return []
    builder = builder if builder is not None else default_builder()
    runner = runner if runner is not None else default_runner()
    b_results = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in cands])
    to_run, inputs = [], []
    for c, br in zip(cands, b_results):
        if br.error_msg:
            failed.append({"name": c.task.name, "rank": c.rank, "stage": "build",
                           "error": str(br.error_msg)[-2000:]})
            logger.warning("build of %s #%d failed: %s", c.task.name, c.rank, br.error_msg)
            continue
        to_run.append(c)
        inputs.append(ms.runner.RunnerInput(
            br.artifact_path, backend_for(target).runner_device,
            ms.arg_info.ArgInfo.from_entry_func(c.sch.mod, remove_preproc=True)))
    out = []
    try:
        futures = runner.run(inputs) if inputs else []
        for c, fut in zip(to_run, futures):
            res = fut.result()
            secs = [float(getattr(s, "value", s)) for s in (res.run_secs or [])]
            if res.error_msg or not secs:
                failed.append({"name": c.task.name, "rank": c.rank, "stage": "run",
                               "error": str(res.error_msg or "no run time")[-2000:]})
                logger.warning("run of %s #%d failed: %s", c.task.name, c.rank, res.error_msg)
                continue
            out.append((c, secs))
    finally:
        for br in b_results:  # the built artifacts are temporary, as in MetaSchedule's callback
            if br.artifact_path and os.path.isfile(br.artifact_path):
                ms.utils.remove_build_dir(br.artifact_path)
    return out


def tune(mod: Union[ModLike, "relax.Function"], target: TargetLike,
         work_dir: Union[str, os.PathLike], topk: int = 1, measure: bool = False,
         runner: Optional[ms.runner.Runner] = None, builder: Optional[ms.builder.Builder] = None,
         device: Optional[DeviceModel] = None,
         report: Optional[list] = None) -> ms.database.JSONDatabase:
    """Write roller's top-k schedules of every PrimFunc in ``mod`` as MetaSchedule tuning records.

    ``mod``: a PrimFunc, an IRModule of PrimFuncs, or a Relax IRModule (its tasks are the PrimFuncs
    of ``fusion_passes()(mod)``, the ones ``MetaScheduleApplyDatabase`` looks up after fusing).
    With ``measure=False`` the records carry roller's predicted times and the database is marked
    ``"run_secs": "predicted"``; with ``measure=True`` each schedule is built and timed through
    MetaSchedule's ``builder``/``runner`` (default: a LocalBuilder without the tensor-intrinsic
    import and a LocalRunner; pass ``ms.runner.RPCRunner`` for a remote device) and only measured
    times are recorded. Functions roller declines and failed builds/runs are logged and listed
    in ``work_dir/roller_database.json`` (``read_manifest``), never recorded. ``report`` (a
    list) gets each task's entry (:class:`~tvm_roller.planner.FuncReport`), as a Relax compile
    reports its functions. ``target`` may be a :class:`~tvm_roller.planner.Context`.
    """
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    ctx = context_for(target, device)  # UnsupportedError: no backend
    tgt = ctx.target
    tasks = extract_tasks(mod, ctx)
    work_dir = _prepare_work_dir(work_dir)
    kind = MEASURED if measure else PREDICTED
    man = _check_mixing(work_dir, kind, tgt)

    declined: List[Dict[str, str]] = []
    failed: List[Dict[str, Any]] = []
    cands = _plan_candidates(tasks, ctx, topk, declined, failed, report)
    if measure:
        timed = _measure(cands, tgt, builder, runner, failed)
    else:
        timed = [(c, [c.predicted_s]) for c in cands]

    # mark the database before the first record lands in it: an interrupted run must not leave
    # predicted records in a work_dir that looks like MetaSchedule's (measured) own
    man = man or {"format": _FORMAT, "run_secs": kind, "target": _target_json(tgt),
                  "seeds": [], "declined": [], "failed": []}
    _write_manifest(work_dir, man)
    db = ms.database.JSONDatabase(work_dir=work_dir)
    line = _count_lines(os.path.join(work_dir, _RECORDS))
    for c, secs in timed:
        wl = db.commit_workload(c.task.workload)
        db.commit_tuning_record(ms.database.TuningRecord(
            c.sch.trace, wl, run_secs=secs, target=tgt,
            args_info=ms.arg_info.ArgInfo.from_entry_func(c.sch.mod, remove_preproc=True)))
        man["seeds"].append({"line": line, "task": c.task.name, "aliases": c.task.aliases,
                             "rank": c.rank, "predicted_s": c.predicted_s, "run_secs": secs})
        line += 1
    man["declined"] += declined
    man["failed"] += failed
    _write_manifest(work_dir, man)
    logger.info("roller: %d %s record(s) for %d task(s) in %s; %d declined, %d failed",
                len(timed), kind, len(tasks), work_dir, len(declined), len(failed))
    return db


def default_cost_model(num_warmup_samples: int = 0,
                       num_tuning_cores: int = 1) -> ms.cost_model.XGBModel:
    """MetaSchedule's XGBoost cost model, guessing from the first measured samples on.

    With the default ``num_warmup_samples=100`` the model returns uniform random scores for the
    first 100 trials, so at budgets of a few hundred trials, and for any database warm start,
    the search would be blind. Use the same model for a from-scratch baseline.
    """
    return ms.cost_model.XGBModel(num_warmup_samples=num_warmup_samples,
                                  num_tuning_cores=num_tuning_cores)


def warm_cost_model(cost_model: ms.cost_model.CostModel, database: ms.database.Database,
                    tasks: Sequence[Task], target: tvm.target.Target) -> int:
    """Train ``cost_model`` on the measured records ``database`` holds for ``tasks``.

    MetaSchedule updates its cost model only from the trials of the current run; records already
    in the database (roller's seeds) would join the initial population with random scores and
    rarely be picked for mutation. Returns the number of records fed to the model.
    """
    import_tensor_intrin()  # TuneContext imports it; done here in seconds, not a minute
    fed = 0
    for task in tasks:
        if not database.has_workload(task.workload):
            continue
        recs = database.get_top_k(database.commit_workload(task.workload), max(1, len(database)))
        if not recs:
            continue
        # the context only supplies the target and the workload (the model groups samples by it)
        ctx = ms.TuneContext(mod=task.workload, target=target, task_name=task.name,
                             num_threads=1)
        results = [ms.runner.RunnerResult([float(getattr(s, "value", s)) for s in r.run_secs], None)
                   for r in recs]
        cost_model.update(ctx, [r.as_measure_candidate() for r in recs], results)
        fed += len(recs)
    return fed


def _check_notebook_deps() -> None:
    # Inside Jupyter, MetaSchedule's task scheduler prints its progress table through pandas and
    # fails mid-run without it; say so before anything is measured.
    in_jupyter = tvm.get_global_func("s_tir.meta_schedule.using_ipython")()
    if in_jupyter and importlib.util.find_spec("pandas") is None:
        raise ImportError("MetaSchedule tuning inside Jupyter needs pandas (it prints the progress "
                          "table with it): pip install pandas")


def tune_seeded(mod: Union[ModLike, "relax.Function"], target: TargetLike,
                work_dir: Union[str, os.PathLike], max_trials: int, *, topk: int = 4,
                num_trials_per_iter: int = 32, runner: Optional[ms.runner.Runner] = None,
                builder: Optional[ms.builder.Builder] = None,
                strategy: ms.search_strategy.SearchStrategy.SearchStrategyType = "evolutionary",
                space: Optional[ms.space_generator.SpaceGenerator] = None,
                cost_model: Optional[ms.cost_model.CostModel] = None,
                num_tuning_cores: int = 1, seed: Optional[int] = None,
                device: Optional[DeviceModel] = None) -> ms.database.JSONDatabase:
    """MetaSchedule tuning warm-started from roller's measured schedules.

    1. ``tune(..., measure=True)``: roller's top-k schedules per task are measured into
       ``work_dir``'s JSON database (refused if it holds predicted records).
    2. The cost model (``default_cost_model()`` unless given) is trained on the measured records
       of the tasks, so the search scores roller's schedules and their mutations as what they are.
    3. ``ms.tune_tir`` (``tune_relax`` on the fused module for Relax) runs ``max_trials`` more
       trials on that database. Its evolutionary search takes each task's best measured records,
       roller's among them, into the initial population (``PickBestFromDatabase``) and mutates
       their tile sizes (``MutateTileSize`` on roller's ``sample_perfect_tile`` decisions).

    ``trial_records(work_dir)`` gives every trial in order (roller's first);
    ``seed_descendants(work_dir)`` the trials derived from roller's records.
    """
    if max_trials < 1:
        raise ValueError(f"max_trials must be >= 1, got {max_trials}")
    if num_trials_per_iter < 1:
        raise ValueError(f"num_trials_per_iter must be >= 1, got {num_trials_per_iter}")
    if num_tuning_cores < 1:
        raise ValueError(f"num_tuning_cores must be >= 1, got {num_tuning_cores}")
    _check_notebook_deps()
    builder = builder if builder is not None else default_builder()
    runner = runner if runner is not None else default_runner()
    ctx = context_for(target, device)
    tgt = ctx.target
    db = tune(mod, ctx, work_dir, topk=topk, measure=True, runner=runner, builder=builder)
    work_dir = os.path.abspath(os.fspath(work_dir))
    if cost_model is None:
        cost_model = default_cost_model(num_tuning_cores=num_tuning_cores)
    stats: Dict[str, int] = {}
    if space is None:
        space = search_space(stats, ctx)
    fed = warm_cost_model(cost_model, db, extract_tasks(mod, ctx), tgt)
    logger.info("cost model trained on %d measured record(s) before tuning", fed)
    if isinstance(mod, relax.Function):
        mod = tvm.IRModule({"main": mod})
    if isinstance(mod, tvm.IRModule) and _is_relax(mod):
        db = ms.relax_integration.tune_relax(
            fused_module(mod, ctx), params={}, target=tgt, work_dir=work_dir,
            max_trials_global=max_trials, num_trials_per_iter=num_trials_per_iter,
            builder=builder, runner=runner, database=db, cost_model=cost_model,
            space=space, strategy=strategy, seed=seed)
    else:
        db = ms.tune_tir(mod, tgt, work_dir, max_trials_global=max_trials,
                         num_trials_per_iter=num_trials_per_iter, builder=builder, runner=runner,
                         database=db, cost_model=cost_model, space=space, strategy=strategy,
                         num_tuning_cores=num_tuning_cores, seed=seed)
    man = read_manifest(work_dir)
    man.setdefault("seeded_runs", []).append({
        "max_trials": max_trials, "num_trials_per_iter": num_trials_per_iter,
        "cost_model_records": fed, "mutations": dict(stats)})
    _write_manifest(work_dir, man)
    if stats.get("rejected"):
        logger.info("%d of %d tile-size mutations did not replay and were rejected",
                    stats["rejected"], stats["mutated"])
    return db


__all__ = ["tune", "tune_seeded", "extract_tasks", "fused_module", "Task", "read_manifest",
           "trial_records", "TrialRecord", "seed_descendants", "default_builder",
           "default_runner", "default_cost_model", "warm_cost_model", "search_space",
           "ReplayCheckedMutator", "build_without_tensor_intrin", "MANIFEST", "PREDICTED",
           "MEASURED"]
