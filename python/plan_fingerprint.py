"""Fingerprints of what roller plans, to show that a change kept every plan and kernel.

    python python/plan_fingerprint.py dump OUT.json [--models small|full|none]
    python python/plan_fingerprint.py compare BEFORE.json AFTER.json

``dump`` plans every suite workload (top-3) for a fixed host-like CPU target and for
``nvidia/nvidia-h100`` and records a hash of each rTile (every field but the notes) and of the
best schedule (``sch.mod.script()``); with ``--models`` it also compiles the example HuggingFace
models (``harness.examples.hf_models``) through ``tvm_roller.relax.compile`` and records each
PrimFunc's report entry (status, kind, rTile, fallback, fusion) and the matmul-chain decisions.
Run it once per tree (e.g. ``PYTHONPATH=<a git worktree>``), then ``compare`` lists what differs;
it runs on the trees before and after the package's re-layout (issue 26) alike.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import warnings

CPU_TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
TARGETS = {"cpu": CPU_TARGET, "h100": "nvidia/nvidia-h100"}


def _tile_record(t) -> dict:
    d = json.loads(t.to_json())
    d.pop("notes", None)  # wording, not a decision
    return d


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def dump_plans() -> dict:
    import tvm_roller
    from tvm_roller import UnsupportedError  # (the root export: any version of the tree)

    apply, W = _tree("apply"), _tree("workloads")

    out = {}
    for tname, tgt in TARGETS.items():
        for cls, idx in W.list_workloads(None):
            name = f"{tname}/{W.workload_name(cls, idx)}"
            try:
                p = tvm_roller.plan(W.create(cls, idx), tgt, topk=3)
            except UnsupportedError as err:
                out[name] = {"declined": str(err)}
                continue
            out[name] = {"tiles": [_tile_record(t) for t in p.tiles],
                         "schedule": _digest(apply(p, p.tiles[0]).mod.script())}
    return out


def dump_models(size: str) -> dict:
    import tvm_roller.relax as rr

    import_torch, hf_models = _tree("import_torch"), _tree("hf_models")

    out = {}
    for name, make in hf_models.MODELS.items():
        model, x = make(size)
        report, chains = [], []
        rr.compile(import_torch(model, x), CPU_TARGET, report=report, cache=False, chains=chains)
        funcs = {e["name"]: {"status": e["status"], "kind": e["kind"], "fallback": e["fallback"],
                             "fusion": e["fusion"],
                             "rtile": {k: v for k, v in (e["rtile"] or {}).items()
                                       if k != "notes"}} for e in report}
        out[f"{name}/{size}"] = {"funcs": funcs, "chains": chains}
        print(f"{name}: {len(funcs)} PrimFuncs", file=sys.stderr, flush=True)
    return out


# where each name lives, newest layout first: this tree (the harness under python/), the
# tools/ layout before it (issue 41), the one before planner/ cache/ integrations/ tools/
# (issue 26); the first that imports is used, so one script fingerprints every tree
_PLACES = {"apply": ("tvm_roller.planner", "tvm_roller.api"),
           "workloads": ("tvm_roller.tools.suite.workloads", "tvm_roller.suite.workloads"),
           "import_torch": ("tvm_roller.integrations.pytorch", "tvm_roller.compile_model"),
           "hf_models": ("harness.examples.hf_models", "tvm_roller.tools.examples.hf_models",
                         "tvm_roller.examples.hf_models")}


def _tree(name: str):
    import importlib

    for module in _PLACES[name]:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:  # an older layout, or the harness of a newer tree
            missing = err
            continue
        return mod if module.endswith(name) else getattr(mod, name)
    raise missing


def compare(before: dict, after: dict) -> int:
    """Print what differs; the number of differing entries."""
    diffs = 0
    for section in ("plans", "models"):
        b, a = before.get(section, {}), after.get(section, {})
        for key in sorted(set(b) | set(a)):
            if key not in b or key not in a:
                print(f"{section} {key}: only in {'after' if key in a else 'before'}")
                diffs += 1
                continue
            items = [(key, b[key], a[key])] if section == "plans" else \
                [(f"{key} {f}", b[key]["funcs"].get(f), a[key]["funcs"].get(f))
                 for f in sorted(set(b[key]["funcs"]) | set(a[key]["funcs"]))]
            if section == "models" and b[key]["chains"] != a[key]["chains"]:
                print(f"{key}: chain decisions differ")
                diffs += 1
            for name, x, y in items:
                if x != y:
                    diffs += 1
                    print(f"{section} {name}: {_what_differs(x, y)}")
        same = len(set(b) & set(a))
        print(f"{section}: {same} entries in both")
    print(f"{diffs} differing entries")
    return diffs


def _what_differs(x, y) -> str:
    if not isinstance(x, dict) or not isinstance(y, dict):
        return f"{x!r} -> {y!r}"
    keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
    if keys == ["tiles"]:
        keys = sorted({k for tx, ty in zip(x["tiles"], y["tiles"]) for k in set(tx) | set(ty)
                       if tx.get(k) != ty.get(k)} | ({"count"} if len(x["tiles"]) !=
                                                      len(y["tiles"]) else set()))
        return "tiles differ in " + ", ".join(keys)
    if keys == ["rtile"]:
        return "rtile differs in " + ", ".join(
            sorted(k for k in set(x["rtile"]) | set(y["rtile"])
                   if x["rtile"].get(k) != y["rtile"].get(k)))
    return "differs in " + ", ".join(keys)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    d.add_argument("--models", choices=("small", "full", "none"), default="small")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args()
    if args.cmd == "compare":
        with open(args.before, encoding="utf-8") as fb, open(args.after, encoding="utf-8") as fa:
            compare(json.load(fb), json.load(fa))
        return 0
    warnings.simplefilter("ignore")
    data = {"plans": dump_plans()}
    if args.models != "none":
        data["models"] = dump_models(args.models)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=0, sort_keys=True)
    print(f"wrote {args.out}: {len(data['plans'])} plans, "
          f"{sum(len(m['funcs']) for m in data.get('models', {}).values())} model PrimFuncs",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
