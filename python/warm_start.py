"""MetaSchedule from scratch vs MetaSchedule seeded with roller's schedules.

For each workload of the public single-op suite (``tvm_roller.tools.suite``), two tuning runs with the
same trial budget, search space, cost model, builder and runner:

* scratch: ``ms.tune_tir`` on an empty database;
* seeded:  ``tvm_roller.meta_schedule.tune_seeded``: roller's top-k schedules are measured first
  (they count as trials) and MetaSchedule's evolutionary search starts from them.

Per-trial run times come from each run's ``database_tuning_record.json`` in commit order.
Writes one PNG (best latency vs trials, a panel per workload) and the raw curves as JSON.

    python python/warm_start.py                       # GMM:2 and C2D:2, 128 trials each
    python python/warm_start.py --workloads GMM:1 --trials 64 --per-iter 16
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]


def best_so_far(secs: List[float]) -> List[Optional[float]]:
    out, best = [], math.inf
    for s in secs:
        best = min(best, s)
        out.append(best if math.isfinite(best) else None)
    return out


def at(curve: List[Optional[float]], trial: int) -> Optional[float]:
    """Best latency after ``trial`` trials (the last value when the run was shorter)."""
    if not curve:
        return None
    return curve[min(trial, len(curve)) - 1]


def _quiet_metaschedule() -> None:
    # MetaSchedule logs every trial to the console at INFO; each tune_tir call reconfigures its
    # logger (console level = the logger's level, left at DEBUG by the previous run), so lower it
    # before every run. The log files under work_dir/logs keep everything.
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)


def run_pair(name: str, target, trials: int, per_iter: int, topk: int, work_root: Path,
             seed: int) -> Dict[str, Any]:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tvm_roller import meta_schedule as rms
    from tvm_roller.tools.suite import workloads

    cls, idx = workloads.parse_workload(name)[0]
    func = workloads.create(cls, idx)
    flop = workloads.flop_count(func)
    result: Dict[str, Any] = {"flop": flop}

    # scratch: MetaSchedule alone, same space / cost model / builder / runner as the seeded run
    wd = work_root / f"{cls}{idx}_scratch"
    t0 = time.perf_counter()
    stats: Dict[str, int] = {}
    _quiet_metaschedule()
    ms.tune_tir(func, target, str(wd), max_trials_global=trials, num_trials_per_iter=per_iter,
                builder=rms.default_builder(), runner=rms.default_runner(),
                cost_model=rms.default_cost_model(), space=rms.search_space(stats),
                num_tuning_cores=1, seed=seed)
    secs = [r.mean_s for r in rms.trial_records(wd)]
    result["scratch"] = {"run_secs": [s if math.isfinite(s) else None for s in secs],
                         "best_s": best_so_far(secs), "wall_s": time.perf_counter() - t0,
                         "mutations": stats}
    print(f"{name} scratch: {len(secs)} trials, best {min(secs) * 1e3:.4f} ms, "
          f"{result['scratch']['wall_s']:.0f} s", flush=True)

    # seeded: roller's top-k measured first, counted in the same trial budget
    wd = work_root / f"{cls}{idx}_seeded"
    t0 = time.perf_counter()
    _quiet_metaschedule()
    rms.tune_seeded(func, target, wd, max_trials=trials - topk, topk=topk,
                    num_trials_per_iter=per_iter, seed=seed)
    recs = rms.trial_records(wd)
    man = rms.read_manifest(wd)
    secs = [r.mean_s for r in recs]
    desc = rms.seed_descendants(wd)
    n_seeds = len(man["seeds"])
    result["seeded"] = {
        "run_secs": [s if math.isfinite(s) else None for s in secs],
        "best_s": best_so_far(secs), "wall_s": time.perf_counter() - t0,
        "roller_trials": n_seeds,
        "roller_predicted_s": [s["predicted_s"] for s in man["seeds"]],
        "mutations": man["seeded_runs"][-1]["mutations"],
        "descendants": [{"trial": d["trial"] + 1, "seed_trial": d["seed"] + 1,
                         "run_s": d["mean_s"] if math.isfinite(d["mean_s"]) else None,
                         "seed_run_s": d["seed_mean_s"],
                         "changed": {str(k): v for k, v in d["changed"].items()}}
                        for d in desc],
    }
    better = [d for d in desc if d["mean_s"] < min(secs[:n_seeds])]
    print(f"{name} seeded: roller {min(secs[:n_seeds]) * 1e3:.4f} ms in {n_seeds} trials, "
          f"best {min(secs) * 1e3:.4f} ms after {len(secs)}; {len(desc)} trials mutated from "
          f"roller's records ({len(better)} faster than roller's best), "
          f"{result['seeded']['wall_s']:.0f} s", flush=True)
    return result


def plot(data: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    names = list(data["workloads"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        wl = data["workloads"][name]
        for key, label, color in [("scratch", "MetaSchedule from scratch", "tab:blue"),
                                  ("seeded", "MetaSchedule seeded with roller", "tab:orange")]:
            ys = [None if v is None else v * 1e3 for v in wl[key]["best_s"]]
            xs = list(range(1, len(ys) + 1))
            ax.step(xs, ys, where="post", label=label, color=color)
        k = wl["seeded"]["roller_trials"]
        ax.axvspan(0.5, k + 0.5, color="tab:orange", alpha=0.12,
                   label=f"roller's top-{k} (measured)")
        for d in wl["seeded"]["descendants"]:
            if d["run_s"] is not None:
                ax.plot(d["trial"], d["run_s"] * 1e3, "x", color="tab:red", ms=5)
        ax.plot([], [], "x", color="tab:red", label="trial mutated from a roller record")

        # the interesting range is near the optimum: clip the first random samples and the
        # slow mutations at 2x the final best
        lows = [v for key in ("scratch", "seeded") for v in wl[key]["best_s"] if v is not None]
        ax.set_ylim(min(lows) * 1e3 * 0.9, min(max(lows), 2 * min(lows)) * 1e3)
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
        ax.set_xlabel("trials (measured candidates)")
        ax.set_ylabel("best latency so far (ms)")
        n_desc = len(wl["seeded"]["descendants"])
        ax.set_title(f"{name} ({wl['flop'] / 1e6:.0f} MFLOP): {n_desc} of "
                     f"{len(wl['seeded']['run_secs']) - k} seeded MetaSchedule trials\n"
                     "are mutations of roller's records", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Warm start: {data['target']['mcpu']}, {data['target']['num-cores']} cores, "
                 f"{data['settings']['trials']} trials, {data['settings']['per_iter']} per iter",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="GMM:2,C2D:2",
                    help="suite workloads, CLASS:INDEX, comma separated (default GMM:2,C2D:2)")
    ap.add_argument("--trials", type=int, default=128, help="trial budget per run (default 128)")
    ap.add_argument("--per-iter", type=int, default=32, help="num_trials_per_iter (default 32)")
    ap.add_argument("--topk", type=int, default=4,
                    help="roller schedules measured as seeds, counted as trials (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="MetaSchedule's random seed")
    ap.add_argument("--target", default=None,
                    help='target JSON (default: this host, {"kind": "llvm"} completed by roller)')
    ap.add_argument("--work-dir", default=None, help="keep the databases here (default: temp)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "warm_start.png"))
    ap.add_argument("--json", default=str(ROOT / "docs" / "warm_start.json"))
    ap.add_argument("--replot", action="store_true",
                    help="only redraw --out from an existing --json (no tuning)")
    args = ap.parse_args(argv)
    if args.replot:
        with open(args.json, encoding="utf-8") as fh:
            plot(json.load(fh), Path(args.out))
        print(f"wrote {args.out}")
        return 0
    if args.trials <= args.topk:
        ap.error("--trials must exceed --topk (roller's seeds count as trials)")

    sys.path.insert(0, str(ROOT))
    import tvm_roller
    from tvm_roller.tools.suite import workloads

    names = [workloads.workload_name(c, i) for c, i in workloads.list_workloads(args.workloads)]
    target = tvm_roller.hardware.normalize_target(json.loads(args.target) if args.target
                                                  else {"kind": "llvm"})
    work_root = Path(args.work_dir or tempfile.mkdtemp(prefix="warm_start_"))
    work_root.mkdir(parents=True, exist_ok=True)
    data: Dict[str, Any] = {
        "target": json.loads(str(target)),
        "settings": {"trials": args.trials, "per_iter": args.per_iter, "topk": args.topk,
                     "seed": args.seed, "cost_model": "XGBModel(num_warmup_samples=0)",
                     "search_space": "default llvm, MutateTileSize replay-checked",
                     "runner": "LocalRunner number=3 repeat=3 min_repeat_ms=20"},
        "load_avg_before": os.getloadavg(),
        "workloads": {},
    }
    t0 = time.perf_counter()
    for name in names:
        data["workloads"][name] = run_pair(name, target, args.trials, args.per_iter, args.topk,
                                           work_root, args.seed)
    data["wall_s"] = time.perf_counter() - t0
    data["load_avg_after"] = os.getloadavg()

    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
    plot(data, Path(args.out))

    checkpoints = [c for c in (8, 16, 32, 64, 128, 256) if c <= args.trials]
    print("\nbest latency (ms) after N trials")
    print(f"{'workload':10} {'run':8} " + " ".join(f"{c:>8}" for c in checkpoints))
    for name, wl in data["workloads"].items():
        for key in ("scratch", "seeded"):
            vals = [at(wl[key]["best_s"], c) for c in checkpoints]
            print(f"{name:10} {key:8} " + " ".join(
                f"{v * 1e3:8.4f}" if v is not None else f"{'-':>8}" for v in vals))
    print(f"\nwrote {args.out} and {args.json} ({data['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
