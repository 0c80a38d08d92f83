"""``tvm-roller`` command line: ``suite``, ``calibrate``, ``explain``.

Heavy imports (tvm, torch, roller itself) happen inside the subcommands so ``--help`` is instant.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, List, Optional

_TARGET_HELP = ("target as a JSON dict (e.g. '{\"kind\": \"llvm\", \"mcpu\": \"znver4\", "
                "\"num-cores\": 2}') or a tag / kind string ('llvm', 'nvidia/nvidia-h100'); "
                "default: this host's CPU")


def _target(s: Optional[str]) -> Any:
    # The JSON form is parsed here so a typo fails with a clear message, not deep inside TVM.
    from tvm_roller.suite.runner import parse_target

    return parse_target(s)


def _cmd_suite(args: argparse.Namespace) -> int:
    from tvm_roller.suite import workloads
    from tvm_roller.suite.runner import run_suite

    workloads.list_workloads(args.ops)  # validate before the heavy imports
    records = run_suite(ops=args.ops, target=_target(args.target), json_out=args.json,
                        repeat=args.repeat, peers=not args.no_peers)
    return 0 if records and all(r["ok"] for r in records) else 1


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from tvm_roller.hardware import calibrate

    model = calibrate(target=_target(args.target), quick=args.quick)
    print(str(model))
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    import tvm_roller
    from tvm_roller.suite import workloads

    wls = workloads.list_workloads(args.op)
    for cls, idx in wls:
        func = workloads.create(cls, idx)
        target = _target(args.target) or {"kind": "llvm"}
        if len(wls) > 1:
            print(f"== {workloads.workload_name(cls, idx)} ==")
        print(tvm_roller.explain(func, target))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tvm-roller",
        description="ROLLER-style constructed schedules for Apache TVM 0.27 (no search).")
    sub = ap.add_subparsers(dest="cmd", metavar="{suite,calibrate,explain}")
    sub.required = True

    s = sub.add_parser("suite", help="run the 52-workload single-op suite against its peers",
                       description="Construct, build, check and time every workload of TVM's "
                                   "te_workload suite (13 classes x 4 shapes) and compare with "
                                   "PyTorch, numpy, TVM's unscheduled build and the shared "
                                   "MetaSchedule-tuned records. Exit status 1 if any workload "
                                   "failed or was wrong.")
    s.add_argument("--ops", default=None,
                   help="comma-separated CLASS or CLASS:INDEX, e.g. 'GMM,C2D:1' (default: all 52)")
    s.add_argument("--target", default=None, help=_TARGET_HELP)
    s.add_argument("--json", metavar="OUT", default=None, help="write one JSON object per workload")
    s.add_argument("--no-peers", action="store_true", help="time roller's kernels only")
    s.add_argument("--repeat", type=int, default=5, help="timing repeats (median; default 5)")
    s.set_defaults(fn=_cmd_suite)

    c = sub.add_parser("calibrate", help="measure the device model roller plans with and print it")
    c.add_argument("--target", default=None, help=_TARGET_HELP)
    c.add_argument("--quick", action="store_true", help="short measurements")
    c.set_defaults(fn=_cmd_calibrate)

    e = sub.add_parser("explain", help="print roller's plan for a suite workload")
    e.add_argument("--op", required=True, help="CLASS:INDEX, e.g. GMM:1 (a bare CLASS explains all 4)")
    e.add_argument("--target", default=None, help=_TARGET_HELP)
    e.set_defaults(fn=_cmd_explain)
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return int(args.fn(args))
    except ValueError as e:
        # Bad --ops / --target / unsupported workload: one clear line instead of a traceback.
        print(f"tvm-roller {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
