"""Re-tune the suite's MetaSchedule baselines on this machine (``ms.tune_tir``, best record kept).

The suite's "x MS-tuned" column then uses these records instead of the shipped ones (tuned on a
2-core Zen 4 for skylake-avx512), so the peer is tuned where it is measured. See
``tvm_roller/suite/tune_baselines.py``. About 74 minutes for all 13 workloads on 2 cores.

    python python/tune_baselines.py                          # shape 1 of all 13 classes, 192 trials
    python python/tune_baselines.py --ops C2D:1,GMM:1        # just these (others already there kept)
    python python/tune_baselines.py --ops GMM --trials 4 --per-iter 4 --out /tmp/ms-smoke
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=None,
                    help="CLASS[:INDEX] list, e.g. C2D:1,GMM:1; a bare class means index 1 "
                         "(default: index 1 of all 13 classes)")
    ap.add_argument("--target", default=None,
                    help='target JSON (default: this host, {"kind": "llvm"} completed by roller, '
                         "as the suite uses)")
    ap.add_argument("--trials", type=int, default=192,
                    help="max_trials_global per workload (default 192)")
    ap.add_argument("--per-iter", type=int, default=32, help="num_trials_per_iter (default 32)")
    ap.add_argument("--seed", type=int, default=None, help="MetaSchedule's random seed")
    ap.add_argument("--out", default=None,
                    help="output folder (default: the re-tuned place the suite looks in, "
                         "~/.cache/tvm-roller/baselines/metaschedule-llvm-<mcpu>-<N>c)")
    ap.add_argument("--work-dir", default=None,
                    help="keep MetaSchedule's work dirs (all records, logs) here (default: temp)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from tvm_roller.tools.suite.runner import parse_target
    from tvm_roller.tools.suite.tune_baselines import tune_baselines

    try:
        lines = tune_baselines(args.ops, parse_target(args.target), args.out, trials=args.trials,
                               per_iter=args.per_iter, seed=args.seed, work_dir=args.work_dir)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if lines else 1


if __name__ == "__main__":
    sys.exit(main())
