"""Run the suite: construct each workload's schedule with roller, build, check, time, compare.

For every workload: random inputs (``np.random.default_rng(seed)``, uniform in [-1, 1]),
``tvm_roller.schedule`` (timed: ``construct_s``), ``tvm.compile`` (``build_s``), one run checked
against the float64 reference, then ``time_evaluator`` (median). Peers, re-measured in the same
process: PyTorch (float32, ``set_num_threads(num-cores)``), numpy (GMM/SFM/NRM), TVM's own
unscheduled build, and the shared MetaSchedule-tuned record where one exists.

A failure in one workload (schedule/build/run raising) is recorded with its message (``ok`` False,
``error``) and the suite goes on.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple

import numpy as np

from tvm_roller.tools.suite import baselines, quiet, references, workloads

if TYPE_CHECKING:  # pragma: no cover
    import tvm
    from tvm.s_tir import Schedule

# Errors a workload's schedule/build/run may raise. TVM's own errors (ScheduleError, InternalError,
# OpError, ...) subclass RuntimeError; roller's UnsupportedError is a ValueError. ImportError and
# KeyboardInterrupt are deliberately absent: they are not per-workload failures.
WORKLOAD_ERRORS: Tuple[type, ...] = (
    RuntimeError, ValueError, TypeError, AttributeError, IndexError, KeyError, AssertionError,
    NotImplementedError, ArithmeticError, MemoryError,
)

# TVM's unscheduled build runs at ~0.35-4 GFLOP/s here; assume 0.5 to estimate one run and skip
# the peer when that estimate exceeds DEFAULT_BUDGET_S (C3D:0/2/3 and GMM:3 take 4-30 s each).
NAIVE_GFLOPS = 0.5
DEFAULT_BUDGET_S = 2.0

PEERS = ("torch", "numpy", "tvm_default", "ms_tuned")
_PEER_LABEL = {"torch": "xtorch", "numpy": "xnumpy", "tvm_default": "xtvm-def", "ms_tuned": "xMS-tuned"}

ScheduleFn = Callable[[Any, Any], "Schedule"]


def parse_target(target: Any) -> Any:
    """A CLI/user target: None, a JSON dict string, a tag or kind string, a dict or a Target."""
    if isinstance(target, str) and target.strip().startswith("{"):
        try:
            return json.loads(target)
        except json.JSONDecodeError as e:
            raise ValueError(f"target {target!r} is not a valid JSON dict: {e}") from None
    return target


def resolve_target(target: Any = None,
                   normalize: Optional[Callable[[Any], "tvm.target.Target"]] = None
                   ) -> "tvm.target.Target":
    """roller's normalized target (mcpu and num-cores completed for llvm); host CPU by default."""
    target = parse_target(target)
    if target is None:
        target = {"kind": "llvm"}
    if normalize is None:
        from tvm_roller.hardware import normalize_target as normalize
    return normalize(target)


def _device(target: "tvm.target.Target"):
    import tvm

    return tvm.cpu(0) if target.kind.name == "llvm" else tvm.device(target.kind.name, 0)


def _num_cores(target: "tvm.target.Target") -> int:
    n = target.attrs.get("num-cores") if target.kind.name == "llvm" else None
    return int(n) if n else (os.cpu_count() or 1)


# Pause before timing a different runtime: TVM's pool workers and torch's OpenMP threads busy-wait
# for a while after their last parallel region and would steal one of the 2 cores from the next.
SETTLE_S = 0.05


def _settle() -> None:
    time.sleep(SETTLE_S)


def _load_avg() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return None


def _busy_warning() -> Optional[str]:
    """Other processes on a 2-core box make every latency (OpenMP peers most) noisy: say so."""
    load, cores = _load_avg(), os.cpu_count() or 1
    if load is not None and load > 0.5 * cores:
        return (f"warning: load average {load:.2f} on {cores} cores before the run: other "
                f"processes are running, latencies (multi-threaded peers most) will be noisy")
    return None


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:500]


def time_callable(fn: Callable[[], Any], repeat: int, min_repeat_ms: float) -> float:
    """Median seconds per call of a Python peer, measured like ``time_evaluator``: one warm-up
    call, then ``repeat`` batches of ``number`` calls, ``number`` grown until a batch lasts
    ``min_repeat_ms``."""
    t0 = time.perf_counter()
    fn()  # warm-up: allocator, oneDNN primitive creation, thread pool start
    one = max(time.perf_counter() - t0, 1e-7)
    number = max(1, math.ceil(min_repeat_ms / 1e3 / one))
    samples = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return float(statistics.median(samples))


def _time_tvm(ex: Any, dev: Any, args: Sequence[Any], repeat: int, min_repeat_ms: int,
              number: int = 1) -> float:
    timer = ex.mod.time_evaluator("main", dev, number=number, repeat=repeat,
                                  min_repeat_ms=int(min_repeat_ms))
    return float(timer(*args).median)


def _run_tvm(ex: Any, dev: Any, inputs: Sequence[np.ndarray],
             out_spec: Tuple[Tuple[int, ...], str]) -> Tuple[List[Any], np.ndarray]:
    """Run once; returns the device args (inputs + output) for timing and the output."""
    import tvm

    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    args.append(tvm.runtime.empty(out_spec[0], out_spec[1], dev))
    ex(*args)
    dev.sync()
    return args, args[-1].numpy()


def _default_schedule() -> ScheduleFn:
    # Resolved once, before the loop: a missing API is an ImportError for the whole run,
    # not 52 recorded failures.
    import tvm_roller

    return tvm_roller.schedule


@dataclass(frozen=True)
class _Case:
    """One workload as its steps (roller, then each peer) share it."""
    cls: str
    idx: int
    func: Any  # the workload's PrimFunc
    target: "tvm.target.Target"
    dev: Any  # the TVM device of ``target``
    inputs: List[np.ndarray]
    out_spec: Tuple[Tuple[int, ...], str]
    ref: np.ndarray  # the float64 reference output
    repeat: int
    min_repeat_ms: int


def _new_record(cls: str, idx: int, func: Any, target: "tvm.target.Target") -> Dict[str, Any]:
    """A row with every key and nothing measured yet."""
    rec: Dict[str, Any] = {
        "workload": workloads.workload_name(cls, idx), "class": cls, "idx": idx, "ok": False,
        "error": None, "construct_s": None, "build_s": None, "latency_s": None,
        "max_rel_err": None, "torch_s": None, "numpy_s": None, "tvm_default_s": None,
        "ms_tuned_s": None, "ms_tune_s": None, "ms_ok": None, "ms_database": None, "notes": [],
        "latency_runs_s": [], "torch_runs_s": [], "plan": None, "foreign_cpu": None,
    }
    rec.update(flops=workloads.flop_count(func), bytes=workloads.bytes_moved(func),
               memory_bound=workloads.is_memory_bound(cls), target=str(target),
               rtol=references.tolerance(cls, idx), load_avg=_load_avg())
    return rec


Timer = Callable[[], float]  # one more timing of a kernel already built: median seconds


def plan_digest(sch: "Schedule") -> str:
    """12 hex digits of the scheduled TIR: two runs with the same digest timed the same kernel
    (a stored run's comparison tells a changed plan from a slower machine)."""
    return hashlib.sha256(sch.mod.script().encode()).hexdigest()[:12]


def _time_roller(rec: Dict[str, Any], case: _Case, schedule: ScheduleFn) -> Optional[Timer]:
    """roller's schedule (construct_s), build (build_s), one checked run and its latency; a
    failure is recorded with the stage it happened in. Returns the kernel's timer once built and
    run (None on failure)."""
    import tvm

    timer: Optional[Timer] = None
    stage = "schedule"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            sch = schedule(case.func, case.target)
            rec["construct_s"] = time.perf_counter() - t0
        rec["notes"].extend(f"{w.category.__name__}: {w.message}" for w in caught)
        rec["plan"] = plan_digest(sch)
        stage = "build"
        t0 = time.perf_counter()
        ex = tvm.compile(sch.mod, case.target)
        rec["build_s"] = time.perf_counter() - t0
        stage = "run"
        args, out = _run_tvm(ex, case.dev, case.inputs, case.out_spec)
        ok, err = references.compare(out, case.ref, rec["rtol"])
        rec["max_rel_err"] = err if math.isfinite(err) else None
        stage = "time"
        timer = lambda: _time_tvm(ex, case.dev, args, case.repeat, case.min_repeat_ms)  # noqa: E731
        _settle()
        rec["latency_s"] = timer()
        rec["ok"] = ok
        if not ok:
            rec["error"] = f"wrong result: max rel err {err:.3g} > {rec['rtol']:.1g}"
    except WORKLOAD_ERRORS as e:
        rec["error"] = f"{stage}: {_err(e)}"
        timer = None
    return timer


def _time_python_peers(rec: Dict[str, Any], case: _Case) -> Optional[Timer]:
    """PyTorch and numpy (CPU targets only). Returns PyTorch's timer (None when it failed)."""
    notes: List[str] = rec["notes"]
    if case.target.kind.name != "llvm":
        notes.append(f"torch/numpy peers: CPU only, target is {case.target.kind.name}")
        return None
    cls, idx, inputs = case.cls, case.idx, case.inputs
    timer: Optional[Timer] = None
    try:
        peer = references.torch_peer(cls, idx, inputs, num_threads=_num_cores(case.target))
        _settle()
        rec["torch_s"] = time_callable(peer.fn, case.repeat, case.min_repeat_ms)
        timer = lambda: time_callable(peer.fn, case.repeat, case.min_repeat_ms)  # noqa: E731
    except WORKLOAD_ERRORS as e:
        notes.append(f"torch: {_err(e)}")
    try:
        npeer = references.numpy_peer(cls, idx, inputs)
        if npeer is not None:
            _settle()
            rec["numpy_s"] = time_callable(npeer.fn, case.repeat, case.min_repeat_ms)
    except WORKLOAD_ERRORS as e:
        notes.append(f"numpy: {_err(e)}")
    return timer


def _time_tvm_default(rec: Dict[str, Any], case: _Case, default_budget_s: float) -> None:
    """TVM's unscheduled build (CPU targets only; skipped when one run would exceed the
    budget)."""
    import tvm

    notes: List[str] = rec["notes"]
    flops = rec["flops"]
    est = flops / (NAIVE_GFLOPS * 1e9)
    if case.target.kind.name != "llvm":
        notes.append("tvm-default: unscheduled TIR needs thread bindings on GPU; skipped")
    elif est > default_budget_s:
        notes.append(f"tvm-default skipped: ~{est:.0f} s per run estimated "
                     f"({flops / 1e9:.1f} GFLOP at ~{NAIVE_GFLOPS} GFLOP/s)")
    else:
        try:
            ex_d = tvm.compile(tvm.IRModule({"main": case.func}), case.target)
            args_d, _ = _run_tvm(ex_d, case.dev, case.inputs, case.out_spec)
            # One run: these are slow (up to ~1 s) and stable.
            _settle()
            rec["tvm_default_s"] = _time_tvm(ex_d, case.dev, args_d, repeat=1, min_repeat_ms=0)
        except WORKLOAD_ERRORS as e:
            notes.append(f"tvm-default: {_err(e)}")


def _time_ms_tuned(rec: Dict[str, Any], case: _Case) -> None:
    """The MetaSchedule-tuned record, where the baseline database has one."""
    import tvm

    cls, idx, target = case.cls, case.idx, case.target
    reason = baselines.skip_reason(target)
    if reason is None:
        try:
            ms_db = baselines.source_info(target)  # which database: shipped, re-tuned here, ...
            rec["ms_database"] = ms_db
            ms_dir = Path(ms_db["path"])
            ms_sch = baselines.tuned_schedule(cls, idx, target, ms_dir)
            if ms_sch is not None:
                rec["ms_tune_s"] = baselines.tune_seconds(cls, idx, ms_dir)
                ex_m = tvm.compile(ms_sch.mod, target)
                args_m, out_m = _run_tvm(ex_m, case.dev, case.inputs, case.out_spec)
                rec["ms_ok"] = references.compare(out_m, case.ref, rec["rtol"])[0]
                _settle()
                rec["ms_tuned_s"] = _time_tvm(ex_m, case.dev, args_m, case.repeat,
                                              case.min_repeat_ms)
        except WORKLOAD_ERRORS as e:
            rec["notes"].append(f"ms-tuned: {_err(e)}")
    elif idx == 1:  # only shape 1 has records: say why once per class
        rec["notes"].append(f"ms-tuned skipped: {reason}")


def _more_rounds(rec: Dict[str, Any], roller: Optional[Timer], torch_peer: Optional[Timer],
                 rounds: int) -> None:
    """Rounds 2..``rounds``: roller's kernel, then PyTorch's, again (paired in time, so that a
    ratio compares timings under the same machine state); the latencies become the rounds'
    medians, every round's kept in ``latency_runs_s`` / ``torch_runs_s``."""
    try:
        for key, timer in (("latency", roller), ("torch", torch_peer)):
            rec[f"{key}_runs_s"] = [rec[f"{key}_s"]] if (timer and rec[f"{key}_s"]) else []
        for _ in range(rounds - 1):
            for key, timer in (("latency", roller), ("torch", torch_peer)):
                if timer:
                    _settle()
                    rec[f"{key}_runs_s"].append(timer())
    except WORKLOAD_ERRORS as e:  # a kernel that ran once and then failed: keep what was timed
        rec["notes"].append(f"rounds: {_err(e)}")
    for key in ("latency", "torch"):
        if rec[f"{key}_runs_s"]:
            rec[f"{key}_s"] = float(statistics.median(rec[f"{key}_runs_s"]))


def run_workload(cls: str, idx: int, target: "tvm.target.Target", *, schedule: ScheduleFn,
                 repeat: int = 5, min_repeat_ms: int = 100, peers: bool = True,
                 seed: int = 0, default_budget_s: float = DEFAULT_BUDGET_S,
                 rounds: int = 1) -> Dict[str, Any]:
    """One row of the suite (see ``run_suite`` for the keys)."""
    sample = quiet.cpu_sample()
    func = workloads.create(cls, idx)
    rec = _new_record(cls, idx, func, target)
    inputs = workloads.random_inputs(func, seed)
    out_spec = workloads.output_spec(func)
    ref = references.reference(cls, idx, inputs)
    case = _Case(cls, idx, func, target, _device(target), inputs, out_spec, ref, repeat,
                 min_repeat_ms)
    roller = _time_roller(rec, case, schedule)
    torch_peer = None
    if peers:
        torch_peer = _time_python_peers(rec, case)
        _time_tvm_default(rec, case, default_budget_s)
        _time_ms_tuned(rec, case)
    _more_rounds(rec, roller, torch_peer, rounds)
    lat = rec["latency_s"]
    if lat:
        rec["gflops"] = rec["flops"] / lat / 1e9
        rec["gbps"] = rec["bytes"] / lat / 1e9
    rec["foreign_cpu"] = share = quiet.foreign_share(sample)
    if share is not None and share > quiet.BUSY_SHARE:
        rec["notes"].append(f"other processes used {100 * share:.0f}% of the CPUs meanwhile: "
                            f"its timings are noisy")
    return rec


QUIET_RETRIES = 2  # with wait_quiet_s: a disturbed workload is timed at most this many more times


def run_quiet_workload(cls: str, idx: int, target: "tvm.target.Target", timing: Dict[str, Any],
                    wait_quiet_s: float) -> Dict[str, Any]:
    """``run_workload``; with ``wait_quiet_s`` after a wait for a quiet machine, again while other
    processes disturbed it (the record least disturbed is kept, its waits in its notes)."""
    best: Optional[Dict[str, Any]] = None
    waits: List[str] = []
    for _ in range(1 + (QUIET_RETRIES if wait_quiet_s > 0 else 0)):
        if wait_quiet_s > 0:
            waited, calm = quiet.wait_for_quiet(wait_quiet_s)
            if waited >= 2 * quiet.PROBE_S or not calm:
                waits.append(f"{waited:.0f} s" + ("" if calm else " (still busy)"))
        rec = run_workload(cls, idx, target, **timing)
        if best is None or (rec["foreign_cpu"] or 0.0) < (best["foreign_cpu"] or 0.0):
            best = rec
        if (rec["foreign_cpu"] or 0.0) <= quiet.BUSY_SHARE:
            break
    assert best is not None  # the loop runs at least once
    if waits:
        best["notes"].append(f"waited for a quiet machine: {', '.join(waits)}")
    return best


# -- report -------------------------------------------------------------------------------------
_COLS = [("workload", 8), ("construct_s", 11), ("build_s", 8), ("latency_ms", 11), ("perf", 13),
         ("xtorch", 7), ("xnumpy", 7), ("xtvm-def", 8), ("xMS-tuned", 9), ("ok", 4)]


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _speedup(rec: Dict[str, Any], peer: str) -> Optional[float]:
    """peer latency / roller latency: > 1 means roller's kernel is faster."""
    p, lat = rec.get(f"{peer}_s"), rec.get("latency_s")
    return p / lat if (p and lat and rec.get("ok")) else None


def format_row(rec: Dict[str, Any]) -> str:
    lat = rec.get("latency_s")
    if lat:
        perf = (f"{rec['gbps']:.1f} GB/s" if rec["memory_bound"] else f"{rec['gflops']:.1f} GF/s")
    else:
        perf = "-"
    cells = [rec["workload"], _fmt(rec.get("construct_s"), ".3f"), _fmt(rec.get("build_s"), ".2f"),
             _fmt(lat * 1e3 if lat else None, ".4f"), perf]
    cells += [_fmt(_speedup(rec, p), ".2f") for p in PEERS]
    cells.append("ok" if rec.get("ok") else "FAIL")
    return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, (_, w)) in enumerate(zip(cells, _COLS)))


def header() -> str:
    return "  ".join(n.rjust(w) if i else n.ljust(w) for i, (n, w) in enumerate(_COLS))


def _geomean(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(records: Sequence[Dict[str, Any]]) -> str:
    n = len(records)
    n_ok = sum(1 for r in records if r.get("ok"))
    cons = [r["construct_s"] for r in records if r.get("construct_s") is not None]
    builds = [r["build_s"] for r in records if r.get("build_s") is not None]
    parts = [f"{n_ok} ok / {n}",
             f"median construct_s {_fmt(statistics.median(cons) if cons else None, '.3f')}",
             f"median build_s {_fmt(statistics.median(builds) if builds else None, '.2f')}"]
    for p in PEERS:
        sp = [s for s in (_speedup(r, p) for r in records) if s]
        g = _geomean(sp)
        parts.append(f"geomean {_PEER_LABEL[p]} {_fmt(g, '.2f')} ({len(sp)})")
    line = "summary: " + "; ".join(parts)
    tuned = [r for r in records if r.get("ms_tune_s") and r.get("construct_s") is not None]
    if tuned:
        line += (f"\nsearch time: MetaSchedule tune_s median "
                 f"{statistics.median(r['ms_tune_s'] for r in tuned):.0f} s vs roller construct_s "
                 f"median {statistics.median(r['construct_s'] for r in tuned):.3f} s "
                 f"on the same {len(tuned)} workloads")
    return line


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    return v


def write_json(records: Sequence[Dict[str, Any]], path: str | os.PathLike) -> None:
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    data = [{k: _jsonable(v) for k, v in r.items()} for r in records]
    p.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def run_suite(ops: Optional[str | Sequence[str]] = None, target: Any = None,
              json_out: Optional[str | os.PathLike] = None, repeat: int = 5,
              peers: bool = True, *, min_repeat_ms: int = 100, seed: int = 0,
              rounds: int = 1, wait_quiet_s: float = 0.0, out: Optional[TextIO] = None,
              _schedule: Optional[ScheduleFn] = None,
              _normalize: Optional[Callable[[Any], "tvm.target.Target"]] = None,
              ) -> List[Dict[str, Any]]:
    """Run the suite and print a table plus a summary line; returns one dict per workload.

    Keys: ``workload`` ("GMM:1"), ``ok``, ``error``, ``construct_s``, ``build_s``, ``latency_s``,
    ``max_rel_err``, ``gflops``, ``gbps``, ``flops``, ``bytes``, ``memory_bound``, the peers'
    latencies ``torch_s``, ``numpy_s``, ``tvm_default_s``, ``ms_tuned_s``, MetaSchedule's search
    time ``ms_tune_s``, ``ms_database`` (the baseline database used: ``source`` shipped / retuned /
    env / shared, ``path``, ``tuned_for``) and ``notes``. ``json_out`` writes that list as JSON.

    ``plan`` is a digest of roller's scheduled TIR; ``foreign_cpu`` the share of all CPUs other
    processes used during the workload (None without /proc/stat).

    ``wait_quiet_s`` > 0: before each workload, wait up to that long for other processes to leave
    the CPUs (``quiet.wait_for_quiet``), and time a workload they disturbed again (up to
    ``QUIET_RETRIES`` times; the least disturbed record is kept).

    ``rounds`` > 1 times roller's kernel and PyTorch's again, alternately, after the other peers
    (``latency_runs_s`` / ``torch_runs_s`` list every round; ``latency_s`` / ``torch_s`` are their
    medians): the stored runs of ``runs`` / ``compare`` are made of these.

    ``_schedule``/``_normalize`` are private hooks for testing the harness without roller.
    """
    out = out or sys.stdout
    wls = workloads.list_workloads(ops)  # ValueError on a bad spec, before any work
    schedule = _schedule or _default_schedule()
    tgt = resolve_target(target, _normalize)

    torch_threads = None
    if peers:
        import torch

        torch_threads = torch.get_num_threads()
    print(f"tvm-roller suite: {len(wls)} workloads, target {tgt}"
          + (f", {rounds} rounds of roller / torch per workload" if rounds > 1 else ""), file=out)
    if peers:
        reason = baselines.skip_reason(tgt)
        print(f"peers: torch ({_num_cores(tgt)} threads), numpy (GMM/SFM/NRM), tvm-default "
              f"(unscheduled), ms-tuned ({reason or baselines.compile_note(tgt)})", file=out)
    busy = _busy_warning()
    if busy:
        print(busy, file=out)
    print("x<peer> = peer latency / roller latency (>1: roller faster); "
          "perf in GB/s for memory-bound SFM/NRM/DEP", file=out)
    print(header(), file=out, flush=True)
    records: List[Dict[str, Any]] = []
    timing = dict(schedule=schedule, repeat=repeat, min_repeat_ms=min_repeat_ms, peers=peers,
                  seed=seed, rounds=rounds)
    try:
        for cls, idx in wls:
            rec = run_quiet_workload(cls, idx, tgt, timing, wait_quiet_s)
            records.append(rec)
            print(format_row(rec), file=out, flush=True)
            for msg in ([rec["error"]] if rec["error"] else []) + rec["notes"]:
                print(f"    {rec['workload']}: {msg}", file=out)
    finally:
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)
        if json_out is not None and records:
            write_json(records, json_out)
    print(summarize(records), file=out, flush=True)
    if json_out is not None:
        print(f"wrote {json_out}", file=out)
    return records
