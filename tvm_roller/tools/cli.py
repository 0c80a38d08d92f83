"""``tvm-roller`` command line: ``suite``, ``calibrate``, ``explain``, ``compile-model``,
``profile-model``, ``costcheck``, ``generate``, ``serve``.

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
    from tvm_roller.tools.suite.runner import parse_target

    return parse_target(s)


def _cmd_suite(args: argparse.Namespace) -> int:
    """Construct, build, check and time every workload of TVM's te_workload suite (13 classes x
    4 shapes) and compare with PyTorch, numpy, TVM's unscheduled build and the shared
    MetaSchedule-tuned records. --save-run FILE stores the run (per workload roller's and
    PyTorch's times and their ratio, medians of --rounds rounds; the machine class, target, date,
    commit); --compare-to FILE compares each workload's ratio to PyTorch with a stored run and
    flags a ratio more than 15% below the stored one. Exit status 1 if any workload failed or was
    wrong or flagged; 2 on bad arguments or a stored run of another machine class or target
    (without --force)."""
    from tvm_roller.tools.suite import compare, runs, workloads
    from tvm_roller.tools.suite.runner import resolve_target, run_suite

    workloads.list_workloads(args.ops)  # validate before the heavy imports
    stored_mode = bool(args.save_run or args.compare_to)
    rounds = args.rounds if args.rounds is not None else (runs.MIN_ROUNDS if stored_mode else 1)
    if stored_mode and rounds < runs.MIN_ROUNDS:
        raise ValueError(f"--save-run / --compare-to need --rounds >= {runs.MIN_ROUNDS}")
    if stored_mode and args.no_peers:
        raise ValueError("--save-run / --compare-to compare with PyTorch: drop --no-peers")
    target = resolve_target(_target(args.target))
    stored = runs.load_run(runs.resolve_path(args.compare_to)) if args.compare_to else None
    if stored is not None:
        why = compare.mismatch(stored, runs.host_machine(), str(target))
        if why and not args.force:
            print(f"tvm-roller suite: refusing to compare with {args.compare_to}: {why} "
                  f"(--force compares anyway)", file=sys.stderr)
            return 2
        if why:
            print(f"warning: comparing across machine classes or targets: {why}")
    records = run_suite(ops=args.ops, target=target, json_out=args.json, repeat=args.repeat,
                        peers=not args.no_peers, rounds=rounds, wait_quiet_s=args.wait_quiet)
    status = 0 if records and all(r["ok"] for r in records) else 1
    if not stored_mode:
        return status
    now = runs.make_run(records, str(target), rounds, args.repeat)
    if args.save_run:
        print(f"stored the run in {runs.save_run(now, args.save_run)}")
    if stored is not None:
        result = compare.compare_runs(stored, now)
        print(compare.format_comparison(result, stored))
        status = 1 if result.flagged else status
    return status


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from tvm_roller.backends.cpu.microkernel.calibrate import with_route_rates
    from tvm_roller.hardware import calibrate
    from tvm_roller.hardware.target import normalize_target

    target = normalize_target(_target(args.target) or {"kind": "llvm"})
    model = with_route_rates(target, calibrate(target=target, quick=args.quick), measure=True,
                             again=True)
    print(str(model))
    for key, gops in sorted((model.cpu.route_gops or {}).items()):
        print(f"  micro-kernel route {key:24s} {gops:9.1f} GOP/s per core (measured)")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    import tvm_roller
    from tvm_roller.hardware import preset
    from tvm_roller.planner import Context
    from tvm_roller.tools.suite import gpu_workloads, workloads

    device = preset(args.device) if args.device else None
    if args.op.upper().startswith("HGEMM"):  # the fp16 GEMMs of the CUDA checks
        funcs = [(args.op.upper(), gpu_workloads.create(args.op.upper()))]
    else:
        funcs = [(workloads.workload_name(c, i), workloads.create(c, i))
                 for c, i in workloads.list_workloads(args.op)]
    ctx = Context.make(_target(args.target) or "llvm", device)  # one for every workload
    for name, func in funcs:
        if len(funcs) > 1:
            print(f"== {name} ==")
        print(tvm_roller.explain(func, ctx))
    return 0


def _cmd_compile_model(args: argparse.Namespace) -> int:
    """Import MODULE, call FACTORY() for an nn.Module, export it with torch.export, compile it
    with roller's Relax pipeline, check it against PyTorch on random input and print compile
    time, latency vs PyTorch and TVM's default build, and the per-function report. Exit status
    1 if the error exceeds --tol."""
    import json

    from tvm_roller.tools.compile_model import compile_model, format_result, load_model

    model, x = load_model(args.model, args.input_shape)
    result = compile_model(model, tuple(x.shape), _target(args.target), name=args.model,
                           cache=not args.no_cache, tvm_default=not args.no_tvm_default,
                           example=x, verify=args.verify)
    print(format_result(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result.to_dict(), fh, indent=1)
    return 0 if result.max_abs_err <= args.tol else 1


def _cmd_profile_model(args: argparse.Namespace) -> int:
    """Compile a model with roller's Relax pipeline (MODEL: MODULE:FACTORY, or hf:NAME for an
    architecture of tvm_roller.tools.models.hf_archs), time every kernel inside the model
    with the Relax VM instrument and print it against its roofline lower bound (FLOPs at the
    calibrated peak, bytes at the bandwidth of the level the data lives in) and roller's
    prediction; a kernel 10x its bound or more that takes >= 50 us or >= 1% of the model's
    time is flagged. Exit status 1 with --strict when a kernel is flagged."""
    import json

    import tvm
    from tvm import relax

    from tvm_roller.integrations import relax as roller_relax
    from tvm_roller.integrations.pytorch import import_torch
    from tvm_roller.planner import Context
    from tvm_roller.tools.compile_model import load_model
    from tvm_roller.tools.kernel_timing import fork_join_s
    from tvm_roller.tools.profile_model import format_profile, profile

    model, x = load_model(args.model, args.input_shape, args.batch)
    ctx = Context.make(_target(args.target) or "llvm")
    report: list = []
    ex = roller_relax.compile(import_torch(model, x), ctx, report, cache=not args.no_cache)
    dev = ctx.runtime_device()
    vm = relax.VirtualMachine(ex, dev)
    rows = profile(vm, tvm.runtime.tensor(x.numpy(), dev), report, calls=args.calls,
                   fork_join_s=fork_join_s(ctx.target, ctx.device.num_units))
    print(f"{args.model}, input {tuple(x.shape)}, target {ctx.target}")
    print(format_profile(rows, top=args.top))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([r.to_dict() for r in rows], fh, indent=1)
    return 1 if args.strict and any(r.flag for r in rows) else 0


def _cmd_costcheck(args: argparse.Namespace) -> int:
    """Measure roller's top-k and random valid rTiles of suite workloads, compare the analytical
    model's and a by-workload cross-validated XGBoost model's predictions with the measured
    latencies, and write OUT/report.json (per workload: op, n_candidates, spearman/kendall of
    model and XGBoost, top1_regret; summary: median_spearman_model, median_spearman_xgb,
    top1_within10_frac), OUT/dataset.json and the plots."""
    import json
    import os

    from tvm_roller.tools.costcheck.dataset import (load_dataset, measure_workloads, repredict,
                                              save_dataset)
    from tvm_roller.tools.costcheck.report import build_report, plot
    from tvm_roller.tools.suite import workloads

    os.makedirs(args.out, exist_ok=True)
    if args.dataset:
        cands, meta = load_dataset(args.dataset)
        if args.repredict:
            cands = repredict(cands, _target(args.target))
    else:
        workloads.list_workloads(args.ops)  # validate before measuring
        cands, meta = measure_workloads(args.ops, _target(args.target), n_top=args.n_top,
                                        n_random=args.n_random, repeat=args.repeat,
                                        seed=args.seed)
        save_dataset(os.path.join(args.out, "dataset.json"), cands, meta)
    report = build_report(cands, meta)
    with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    plots = plot(cands, report, args.out)  # [] with a message when matplotlib is missing
    print(f"{'op':<8} {'n':>3} {'spearman':>9} {'kendall':>8} {'xgb sp':>7} {'xgb kt':>7} "
          f"{'regret':>7}")
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    for r in report["workloads"]:
        print(f"{r['op']:<8} {r['n_candidates']:>3} {fmt(r['spearman_model']):>9} "
              f"{fmt(r['kendall_model']):>8} {fmt(r['spearman_xgb']):>7} "
              f"{fmt(r['kendall_xgb']):>7} {r['top1_regret']:>7.3f}")
    print("summary: " + json.dumps(report["summary"]))
    written = ["report.json"] + ([] if args.dataset else ["dataset.json"])
    written += [os.path.basename(p) for p in plots]
    print(f"wrote {args.out}/" + ", ".join(written))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    """Compile a causal LM with tvm_roller.llm (MODEL: a named configuration with random
    weights, qwen2-0.5b, llama-3.2-1b or tiny, or a local HuggingFace directory), generate
    new tokens after a prompt of token ids with a progress bar, and print prefill and decode
    tokens per second. With --prompt TEXT (a model directory: its tokenizer, and with --chat
    its chat template) the text is printed as it streams, stopping at the eos token."""
    from tvm_roller.tools.generate import format_result, generate, generate_text

    sampling = dict(do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p)
    if args.prompt is not None:
        if args.prompt_ids:
            raise ValueError("--prompt and --prompt-ids: give one")
        generate_text(args.model, args.prompt, args.chat, args.new_tokens, args.max_seq_len,
                      args.weights, args.seed, cache=not args.no_cache, stop=args.stop or (),
                      **sampling)
        return 0
    if args.chat:
        raise ValueError("--chat needs --prompt")
    prompt = [int(t) for t in args.prompt_ids.split(",")] if args.prompt_ids else None
    result = generate(args.model, prompt, args.prompt_len, args.new_tokens, args.max_seq_len,
                      args.seed, progress=not args.no_progress, cache=not args.no_cache,
                      weights=args.weights, **sampling)
    print(format_result(result))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    """Serve a local HuggingFace model directory over an OpenAI-compatible HTTP API
    (/v1/models, /v1/completions, /v1/chat/completions with streaming, /health, /metrics),
    compiled once (or loaded from the module cache) before it listens. One sequence at a
    time, or with --max-batch N up to N decoding together (continuous batching over a paged
    KV cache of --kv-cache-gb); up to --max-queue requests wait, more get a 429. Needs the
    [serve] extra."""
    import os

    try:
        from tvm_roller.tools.serve.runner import ServeConfig, serve
    except ImportError as e:
        raise ValueError(f"{e.name or e} is missing: pip install 'tvm-roller[serve]'") from None
    api_key = args.api_key or os.environ.get("TVM_ROLLER_API_KEY") or None
    return serve(ServeConfig(args.model, args.weights, args.host, args.port, args.max_queue,
                             api_key, args.max_seq_len, args.model_name,
                             cache=not args.no_cache, max_batch=args.max_batch,
                             kv_cache_gb=args.kv_cache_gb, prefill_chunk=args.prefill_chunk))


def _described(cmd) -> str:
    """A subcommand's description: its function's docstring, as one paragraph."""
    return " ".join(cmd.__doc__.split())


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tvm-roller",
        description="ROLLER-style constructed schedules for Apache TVM 0.27 (no search).")
    sub = ap.add_subparsers(dest="cmd",
                            metavar="{suite,calibrate,explain,compile-model,profile-model,"
                                    "costcheck,generate,serve}")
    sub.required = True

    s = sub.add_parser("suite", help="run the 52-workload single-op suite against its peers",
                       description=_described(_cmd_suite))
    s.add_argument("--ops", default=None,
                   help="comma-separated CLASS or CLASS:INDEX, e.g. 'GMM,C2D:1' (default: all 52)")
    s.add_argument("--target", default=None, help=_TARGET_HELP)
    s.add_argument("--json", metavar="OUT", default=None, help="write one JSON object per workload")
    s.add_argument("--no-peers", action="store_true", help="time roller's kernels only")
    s.add_argument("--repeat", type=int, default=5, help="timing repeats (median; default 5)")
    s.add_argument("--rounds", type=int, default=None,
                   help="time roller's kernel and PyTorch's alternately this many times per "
                        "workload (medians; default 1, or 3 with --save-run / --compare-to, "
                        "which need >= 3)")
    s.add_argument("--save-run", metavar="FILE", default=None,
                   help="store the run for a later --compare-to: per workload roller's and "
                        "PyTorch's times and their ratio, with the machine class (CPU model, "
                        "CPU count), target, date, git commit and version")
    s.add_argument("--compare-to", metavar="FILE", default=None,
                   help="compare each workload's ratio to PyTorch with a run stored by "
                        "--save-run ('shipped': this machine class's run in "
                        "tvm_roller/tools/suite/data/runs); flags a ratio < 0.85x the stored "
                        "one (exit status 1); refuses another machine class or target")
    s.add_argument("--force", action="store_true",
                   help="with --compare-to: compare even across machine classes or targets")
    s.add_argument("--wait-quiet", metavar="S", type=float, default=0.0,
                   help="before each workload wait up to S seconds until other processes leave "
                        "the CPUs, and time a workload they disturbed again (up to 2 more "
                        "times); for stored runs on a shared machine (default 0: off)")
    s.set_defaults(fn=_cmd_suite)

    c = sub.add_parser("calibrate", help="measure the device model roller plans with and print it")
    c.add_argument("--target", default=None, help=_TARGET_HELP)
    c.add_argument("--quick", action="store_true", help="short measurements")
    c.set_defaults(fn=_cmd_calibrate)

    e = sub.add_parser("explain", help="print roller's plan for a suite workload")
    e.add_argument("--op", required=True, help="CLASS:INDEX, e.g. GMM:1 (a bare CLASS explains all 4)")
    e.add_argument("--target", default=None, help=_TARGET_HELP)
    e.add_argument("--device", default=None,
                   help="a device preset to plan for (e.g. h200, which has no TVM tag)")
    e.set_defaults(fn=_cmd_explain)

    m = sub.add_parser("compile-model", help="compile a PyTorch model through Relax with roller",
                       description=_described(_cmd_compile_model))
    m.add_argument("model", help="MODULE:FACTORY (e.g. harness.examples.models:bert_layer, "
                                 "python/ on PYTHONPATH) or hf:NAME "
                                 "(tvm_roller.tools.models.hf_archs)")
    m.add_argument("--input-shape", default=None,
                   help="comma-separated input shape, e.g. 1,128,768 (default: the module's "
                        "INPUT_SHAPES entry)")
    m.add_argument("--target", default=None, help=_TARGET_HELP)
    m.add_argument("--no-cache", action="store_true", help="compile from scratch, store nothing")
    m.add_argument("--no-tvm-default", action="store_true",
                   help="skip building/timing TVM's default (unscheduled) build")
    m.add_argument("--tol", type=float, default=1e-3, help="max abs error allowed (default 1e-3)")
    m.add_argument("--verify", action="store_true",
                   help="check every kernel once against TVM's default build of its function "
                        "(a mismatch falls back, reported as an error)")
    m.add_argument("--json", metavar="OUT", default=None, help="write the result as JSON")
    m.set_defaults(fn=_cmd_compile_model)

    p = sub.add_parser("profile-model", help="each kernel of a model against its roofline bound",
                       description=_described(_cmd_profile_model))
    p.add_argument("model", help="MODULE:FACTORY or hf:NAME (e.g. hf:bert, hf:wav2vec2)")
    p.add_argument("--input-shape", default=None, help="for MODULE:FACTORY, e.g. 1,128,768")
    p.add_argument("--batch", type=int, default=1, help="batch of an hf:NAME input (default 1)")
    p.add_argument("--target", default=None, help=_TARGET_HELP)
    p.add_argument("--calls", type=int, default=10, help="model calls averaged (default 10)")
    p.add_argument("--top", type=int, default=25, help="kernels listed (flagged ones always)")
    p.add_argument("--no-cache", action="store_true", help="compile from scratch, store nothing")
    p.add_argument("--strict", action="store_true", help="exit status 1 if a kernel is flagged")
    p.add_argument("--json", metavar="OUT", default=None, help="write every kernel's row")
    p.set_defaults(fn=_cmd_profile_model)

    k = sub.add_parser("costcheck", help="check the micro-model's ranking against measurements",
                       description=_described(_cmd_costcheck))
    k.add_argument("--ops", default=None, help="CLASS or CLASS:INDEX list, e.g. GMM:0,C2D:2")
    k.add_argument("--out", required=True, help="output directory")
    k.add_argument("--target", default=None, help=_TARGET_HELP)
    k.add_argument("--n-top", type=int, default=10, help="roller's top-k measured (default 10)")
    k.add_argument("--n-random", type=int, default=20,
                   help="random valid rTiles measured per workload (default 20)")
    k.add_argument("--repeat", type=int, default=10, help="timing repeats (the best; default 10)")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--dataset", default=None,
                   help="re-analyse an existing dataset.json instead of measuring")
    k.add_argument("--repredict", action="store_true",
                   help="with --dataset: predict its measured tiles again with the current model "
                        "and this machine's device model")
    k.set_defaults(fn=_cmd_costcheck)

    g = sub.add_parser("generate", help="generate tokens with a causal LM compiled by roller",
                       description=_described(_cmd_generate))
    g.add_argument("model", help="qwen2-0.5b, llama-3.2-1b, tiny, or a local HF directory")
    g.add_argument("--prompt-ids", default=None, help="comma-separated prompt token ids")
    g.add_argument("--prompt", default=None,
                   help="a text prompt (MODEL a directory with a tokenizer): the text streams")
    g.add_argument("--chat", action="store_true",
                   help="with --prompt: send it as a user message through the chat template")
    g.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="with --prompt: stop before this text (repeatable)")
    g.add_argument("--weights", default="fp32", choices=["fp32", "int8", "int4"],
                   help="weight format of the linear layers and embeddings (default fp32)")
    g.add_argument("--prompt-len", type=int, default=16,
                   help="random prompt length when no ids are given (default 16)")
    g.add_argument("--new-tokens", type=int, default=32, help="new tokens (default 32)")
    g.add_argument("--max-seq-len", type=int, default=None,
                   help="the cache's length (default: prompt + new tokens; with --prompt the "
                        "model's context, at most 2048)")
    g.add_argument("--do-sample", action="store_true", help="sample instead of greedy")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=50)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0, help="prompt and sampling seed")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--no-cache", action="store_true", help="compile from scratch, store nothing")
    g.set_defaults(fn=_cmd_generate)

    v = sub.add_parser("serve", help="serve a model directory over an OpenAI-compatible API",
                       description=_described(_cmd_serve))
    v.add_argument("model", help="a local HuggingFace model directory (weights and tokenizer)")
    v.add_argument("--weights", default="fp32", choices=["fp32", "int8", "int4"],
                   help="weight format of the linear layers and embeddings (default fp32)")
    v.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    v.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    v.add_argument("--max-queue", type=int, default=32,
                   help="requests that may wait beside the one generating; more get a 429 "
                        "(default 32)")
    v.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 (default: "
                        "$TVM_ROLLER_API_KEY, else none)")
    v.add_argument("--max-seq-len", type=int, default=None,
                   help="the context: prompt + new tokens (default: the model's, at most 2048)")
    v.add_argument("--model-name", default=None,
                   help="the model id clients send (default: the directory's name)")
    v.add_argument("--max-batch", type=int, default=1,
                   help="sequences decoding together (continuous batching; default 1: one at "
                        "a time)")
    v.add_argument("--kv-cache-gb", type=float, default=None,
                   help="the paged KV cache's pool, shared by the sequences in flight, with "
                        "--max-batch > 1 (default: room for --max-batch whole contexts)")
    v.add_argument("--prefill-chunk", type=int, default=128,
                   help="prompt positions prefilled a step while others decode (default 128)")
    v.add_argument("--no-cache", action="store_true", help="compile from scratch, store nothing")
    v.set_defaults(fn=_cmd_serve)
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return int(args.fn(args))
    except (ValueError, OSError) as e:
        # Bad --ops / --target / unsupported workload, a missing or unwritable file: one clear
        # line instead of a traceback.
        print(f"tvm-roller {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
