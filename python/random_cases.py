"""Random-case reliability run: seeded random cases of every op family, each checked in an
isolated worker (``harness.random_cases``).

    python python/random_cases.py --target cpu --seed 0 -n 200 --out cpu.jsonl
    python python/random_cases.py --target cuda --seed 0 -n 100 --jobs 2 --markdown
    python python/random_cases.py --target cpu --seed 0 --only 17,42   # re-run two cases
    python python/random_cases.py --target cpu --families attention -n 100 --seed 44
    python python/random_cases.py --seed 0 -n 100 --lowp --families matmul,batch_matmul \
        --llvm-target '{"kind":"llvm","mcpu":"haswell","num-cores":2}'

CPU: roller's build run and compared with TVM's unscheduled float64 build; the ``attention``
family (CPU only, ``--families attention``) is HF's eager attention as a Relax model compiled
by roller's pipeline and compared with a float64 numpy reference, the summary counting how many
ran as the flash-attention kernel and why the others did not. CUDA (no GPU
needed): lowered, verified, nvcc/ptxas-compiled and held against the device's limits, and its
CPU replica compared. Case ``i`` of a seed does not depend on ``-n``, so ``--only i`` re-runs
exactly the case a big run reported (with the same ``--target``, ``--families``, ``--lowp``).

``--llvm-target JSON``: build the CPU cases for any llvm target (a TVM target dict as JSON, e.g.
``{"kind":"llvm","mtriple":"aarch64-linux-gnu","mattr":["+neon","+dotprod"]}``) instead of the
host. The same cases are drawn for every target. Where this host can run the target's code (same
architecture, and the target's instruction-set features among the host's:
``harness.random_cases.targets``) each case is run and compared as usual; elsewhere it is compiled
to an object file and counted as *not_run* ("built, not run", with the reason), which is neither
ok nor a failure. ``--lowp`` draws the matmuls and batch matmuls as bf16 x bf16 -> float32,
int8 x int8, uint8 x int8 and uint8 x uint8 -> int32 for every CPU target (the host or an
``--llvm-target``); a product roller declines for the target is a *decline* with its reason.

Exit status 1 when any case was wrong, crashed, hung, raised, failed nvcc or broke a limit.
"""
from __future__ import annotations

import argparse
import sys
import time

from harness.random_cases import families, report, runner, targets
from harness.random_cases.case import NOT_RUN, OK, Result


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-n", type=int, default=60, help="number of cases (default 60)")
    ap.add_argument("--jobs", type=int, default=1, help="parallel workers (default 1)")
    ap.add_argument("--timeout", type=float, default=runner.DEFAULT_TIMEOUT_S,
                    help="seconds per case before it counts as a hang (default %(default)g)")
    ap.add_argument("--out", help="write the results here as JSON lines")
    ap.add_argument("--families", help="comma-separated families (default all): "
                    + ", ".join(families.FAMILIES))
    ap.add_argument("--only", help="comma-separated case indices to run (others skipped)")
    ap.add_argument("--lowp", action="store_true", help="CPU matmuls and batch matmuls of "
                    "bf16 x bf16, int8 x int8, uint8 x int8 and uint8 x uint8 operands, for any "
                    "CPU target; pass it again with --only")
    ap.add_argument("--llvm-target", metavar="JSON", help="build the CPU cases for this llvm "
                    "target, e.g. '{\"kind\":\"llvm\",\"mcpu\":\"haswell\",\"num-cores\":2}'; "
                    "cases this host cannot run are built and counted as not_run")
    ap.add_argument("--markdown", action="store_true", help="also print the markdown table")
    ap.add_argument("--quiet", action="store_true", help="progress lines only for cases that "
                    "are not ok (nor built, not run)")
    return ap.parse_args(argv)


def _progress(quiet: bool):
    def show(r: Result, done: int, total: int) -> None:
        if quiet and r.outcome in (OK, NOT_RUN):
            return
        msg = f"  {r.message[:200]}" if r.message else ""
        if "attention" in r.facts:  # how roller built an attention case
            msg += f"  [{r.facts['attention']}]"
        print(f"[{done:4d}/{total}] {r.outcome:10s} {r.seconds:6.2f}s  {r.case.label()}{msg}",
              flush=True)
    return show


def main(argv=None) -> int:
    args = _parse(argv)
    fams = [f.strip() for f in args.families.split(",") if f.strip()] if args.families else None
    only = sorted({int(i) for i in args.only.split(",")}) if args.only else None
    n = max(only) + 1 if only else args.n
    try:
        if args.llvm_target and args.target != "cpu":
            raise ValueError("--llvm-target is for --target cpu")
        llvm_target = targets.parse(args.llvm_target) if args.llvm_target else ""
        cases = families.generate(args.seed, n, args.target, fams, args.lowp, llvm_target)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if only:
        cases = [c for c in cases if c.index in set(only)]
    print(f"{len(cases)} {args.target} case(s), seed {args.seed}, {args.jobs} job(s), "
          f"timeout {args.timeout:g} s", flush=True)
    if llvm_target:
        tgt = targets.target(llvm_target)
        verdict = targets.can_run(tgt)
        if verdict.ok:
            how = "run and compared here"
        elif targets.needs_asm(tgt):  # decided per case from the built code's assembly
            how = f"run where the built code allows ({verdict.reason})"
        else:
            how = f"built, not run ({verdict.reason})"
        print(f"llvm target {llvm_target}: {how}", flush=True)
    t0 = time.perf_counter()
    results = runner.run_cases(cases, args.out, args.timeout, args.jobs,
                               _progress(args.quiet))
    summary = report.summarize(results)
    print()
    print(report.text(summary))
    if args.markdown:
        print()
        on = f" ({llvm_target})" if llvm_target else ""
        print(report.markdown(summary, f"Random cases: {args.target}{on}, seed {args.seed}, "
                                       f"{len(results)} cases"))
    print(f"\n{len(results)} case(s) in {time.perf_counter() - t0:.1f} s"
          + (f"; results in {args.out}" if args.out else ""))
    if summary.failed:
        fam = f" --families {args.families}" if args.families else ""
        fam += " --lowp" if args.lowp else ""
        fam += f" --llvm-target '{llvm_target}'" if llvm_target else ""
        idx = ",".join(str(r.case.index) for r in summary.failures)
        print(f"re-run the failures: python python/random_cases.py --target {args.target} "
              f"--seed {args.seed}{fam} --only {idx}")
    return report.exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
