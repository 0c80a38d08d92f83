"""The build half of the device check (``gpu_check``; here, with TVM, tvm_roller and nvcc):
schedule every selected workload with roller and with dlight (a GEMM chain: roller's way and
unfused), lower each to a kernel bundle (and cubin) and write them with ``manifest.json``.

The GPU machine never runs this, but the tests import it without TVM: TVM and the rest of
tvm_roller are imported inside the functions.
"""
from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from harness.cuda_check.gpu_manifest import (ARCH, CHAIN_IMPLS, FORMAT, MANIFEST,
                                             SUITE_IMPLS)

MAX_DIR_BYTES = 32 * 2**20  # "far below" the 64 MiB a device call may carry
FP16_TOL = 1e-2
HGEMMS = {"HGEMM:4096": (4096, 4096, 4096), "HGEMM:1024": (1024, 1024, 1024),
          "HGEMM:128x3072x768": (128, 3072, 768)}
# GEMM chains E = f(A . B) . D (Chimera fusion), float32: name -> (batch, m, k, l, n, middle) as
# in harness.bench.chains.gemm_chain (A [*batch, m, k], B [*batch, k, l], D [*batch, l, n])
CHAINS: Dict[str, Tuple[Optional[List[int]], int, int, int, int, str]] = {
    "CHAIN:attn512": ([12], 512, 64, 512, 64, "softmax"),  # BERT-base attention, 512 tokens
    "CHAIN:attn512-none": ([12], 512, 64, 512, 64, "none"),  # the same without the softmax
    "CHAIN:attn128": ([12], 128, 64, 128, 64, "softmax"),  # 128 tokens
    "CHAIN:mlp": (None, 128, 768, 3072, 768, "gelu"),  # BERT-base MLP block, 128 tokens
}
CHAIN_TOL = 1e-4  # float32 with TVM's fast_exp in the softmax
ROLLER_MADE = ("roller", "unfused")  # an UnsupportedError from these is roller declining


def _safe(name: str) -> str:
    return name.replace(":", "_")


def _write_gz(path: Path, data: bytes) -> None:
    # mtime=0: the same bundle gives the same bytes (diffable, cache friendly)
    with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
        gz.write(data)


def _hgemm_funcs() -> Dict[str, Callable[[], Any]]:
    """fp16 GEMMs from tvm_roller.tools.suite.gpu_workloads (``HGEMMS`` repeats their shapes so
    that importing this module needs no TVM)."""
    from tvm_roller.tools.suite import gpu_workloads

    if {n: tuple(s) for n, s in gpu_workloads.FP16_GEMMS.items()} != HGEMMS:
        raise RuntimeError("gpu_check.HGEMMS and suite.gpu_workloads.FP16_GEMMS disagree")
    return {name: (lambda n=name: gpu_workloads.create(n)) for name in HGEMMS}


def _workload_specs(ops: Optional[str], chains: Optional[Dict[str, Any]] = None
                    ) -> List[Tuple[str, str, Optional[Tuple[str, int]]]]:
    """[(name, kind, (cls, idx) or None)] for the suite ("suite"), the fp16 GEMMs ("hgemm") and
    the GEMM chains ("chain"; ``chains`` maps their names to shapes, default ``CHAINS``)."""
    from tvm_roller.tools.suite import workloads

    chains = CHAINS if chains is None else chains
    items = [s.strip() for s in ops.split(",") if s.strip()] if ops else None
    special = ("HGEMM", "CHAIN")
    suite_items = ([i for i in items if not i.upper().startswith(special)]
                   if items is not None else None)
    out = []
    if suite_items is None or suite_items:
        for cls, idx in workloads.list_workloads(suite_items):
            out.append((workloads.workload_name(cls, idx), "suite", (cls, idx)))
    for cls, kind, names in (("HGEMM", "hgemm", list(HGEMMS)), ("CHAIN", "chain", list(chains))):
        picked = [i.upper() for i in items if i.upper().startswith(cls)] if items else None
        for name in names:
            if picked is None or cls in picked or name.upper() in picked:
                out.append((name, kind, None))
        unknown = [i for i in picked or [] if i != cls and i not in [n.upper() for n in names]]
        if unknown:
            what = "fp16 GEMM(s)" if cls == "HGEMM" else "GEMM chain(s)"
            raise SystemExit(f"unknown {what} {unknown}; known: {', '.join(names)}")
    return out


def _dlight(func, target):
    import tvm

    from tvm_roller.planner import default_schedule

    return default_schedule(tvm.IRModule({"main": func}), target)


def _one_line(err: BaseException) -> str:
    """The informative line of an error: TVM's "Check failed: ..." when there is one (its
    messages also carry a dump of the offending TIR), else the first line."""
    lines = [l.strip() for l in str(err).strip().splitlines()
             if l.strip() and not l.strip().startswith("^")]
    key = [l for l in lines if "Check failed" in l or "InternalError" in l]
    text = (key or lines or [""])[0]
    return f"{type(err).__name__}: {text[:400]}"


def _write_impl(out: Path, stem: str, mod, ctx, target, dev, nvcc: bool) -> Dict[str, Any]:
    """Lower/generate ``mod`` under ``ctx`` and write its bundle (and cubin); the manifest record."""
    from harness.cuda_check import build as cb

    rec: Dict[str, Any] = {}
    with ctx:
        if nvcc:
            rep = cb.check(mod, target, dev)
            if rep.bundle is None or rep.ptxas is None:
                raise cb.CudaCompileError("; ".join(rep.problems))
            bundle = rep.bundle
            rec["problems"] = rep.problems
            rec["tensor_core"] = rep.tensor_core
            rec["kernels"] = {k: {f: v for f, v in vars(r).items() if f != "name"}
                              for k, r in rep.ptxas.kernels.items()}
            rec["cubin"] = f"{stem}.cubin.gz"
            _write_gz(out / rec["cubin"], Path(rep.ptxas.cubin_path).read_bytes())
        else:
            bundle = cb.kernel_launches(mod, target)
            rec["problems"] = cb.verify(mod, target, dev)
    rec["bundle"] = f"{stem}.json.gz"
    _write_gz(out / rec["bundle"], bundle.to_json().encode())
    rec["launches"] = [[l.name, list(l.grid), list(l.block), l.dyn_smem_bytes] for l in bundle.launches]
    return rec


# -- build, step by step ------------------------------------------------------------------------
@dataclass(frozen=True)
class _BuildSettings:
    """What every workload's build shares: where bundles go, the target and device model, how
    roller's kernels compile and whether nvcc runs."""
    out: Path
    target: Any  # tvm.target.Target, H100 tag with ARCH
    dev: Any  # the "h200" device preset
    roller_pass_context: Callable[[], Any]  # roller's PassContext (cp.async)
    nvcc: bool


def _clear_old_bundles(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for impl in dict.fromkeys(SUITE_IMPLS + CHAIN_IMPLS):
        for old in out.glob(f"*.{impl}.*.gz"):
            old.unlink()  # bundles of an earlier build would only add to what is shipped


def _build_settings(out: Path, nvcc: bool) -> _BuildSettings:
    import tvm

    from tvm_roller import hardware
    from tvm_roller.planner import Context

    target = tvm.target.Target({"tag": "nvidia/nvidia-h100", "arch": ARCH})
    dev = hardware.preset("h200")
    # roller's schedules compile under its PassContext (cp.async); dlight's under TVM's default
    return _BuildSettings(out, target, dev, Context.make(target, dev).pass_context, nvcc)


def _new_entry(name: str, kind: str, wl: Optional[Tuple[str, int]], chains: Dict[str, Any],
               hgemm: Dict[str, Callable[[], Any]]) -> Tuple[Any, Dict[str, Any]]:
    """The workload's PrimFunc and its manifest entry so far: what ``run`` needs for the
    reference (class, named parameters, tolerance, argument shapes) and the traffic counts."""
    from harness.bench.chains import gemm_chain
    from tvm_roller.tools.suite import references, workloads

    if kind == "chain":
        batch, m, k, l, n, middle = chains[name]
        batch = list(batch) if batch else None
        func = gemm_chain(batch, m, k, l, n, middle)
        entry = {"name": name, "kind": kind, "cls": "CHAIN", "idx": None,
                 "params": {"batch": batch, "m": m, "k": k, "l": l, "n": n, "middle": middle},
                 "tol": CHAIN_TOL, "memory_bound": False}
    elif kind == "suite":
        cls, idx = wl
        func = workloads.create(cls, idx)
        entry = {"name": name, "kind": kind, "cls": cls, "idx": idx,
                 "params": references.named_params(cls, idx),
                 "tol": references.tolerance(cls, idx),
                 "memory_bound": workloads.is_memory_bound(cls)}
    else:
        func = hgemm[name]()
        m, n, k = HGEMMS[name]
        entry = {"name": name, "kind": kind, "cls": "HGEMM", "idx": None,
                 "params": {"m": m, "n": n, "k": k}, "tol": FP16_TOL, "memory_bound": False}
    specs = workloads.arg_specs(func)
    entry["args"] = [[list(s), d] for s, d in specs]
    entry["flops"] = workloads.flop_count(func)
    entry["bytes"] = workloads.bytes_moved(func)
    return func, entry


def _impl_makers(settings: _BuildSettings, func: Any, kind: str,
                 plans: List[Any]) -> Dict[str, Callable[[], Tuple[Any, Any]]]:
    """impl name -> a function giving (scheduled module, PassContext to lower it under): roller
    and dlight, or for a chain roller's way and unfused. ``plans`` keeps a chain's roller plan
    (made once for both of its impls)."""
    import tvm

    import tvm_roller
    from tvm_roller.core.errors import UnsupportedError
    from tvm_roller.fusion import split
    from tvm_roller.planner import apply

    target, dev, roller_pass_context = settings.target, settings.dev, settings.roller_pass_context

    def roller():
        sch = tvm_roller.schedule(func, target, device=dev)
        return sch.mod, roller_pass_context()

    def dlight():
        return _dlight(func, target), tvm.transform.PassContext()

    def chain_plan():
        if not plans:
            plans.append(tvm_roller.plan(func, target, device=dev))
        return plans[0]

    def chain_roller():
        # what tvm_roller.schedule() does (plan, then apply the best rTile), with the plan
        # kept: apply records there when the fused kernel refused a chain the model fused
        p = chain_plan()
        return apply(p, p.tiles[0]).mod, roller_pass_context()

    def chain_unfused():
        # roller's own kernel for each operator alone, stitched into one function: several
        # launches, the intermediates in workspaces
        p = chain_plan()
        if p.chain is None:
            raise UnsupportedError("roller found no GEMM chain in the function")
        sch = split.build_unfused(func, p.chain,
                                  lambda part: tvm_roller.schedule(part, target, device=dev))
        return sch.mod, roller_pass_context()

    return ({"roller": chain_roller, "unfused": chain_unfused} if kind == "chain"
            else {"roller": roller, "dlight": dlight})


def _build_impl(settings: _BuildSettings, name: str, kind: str, impl: str,
                make: Callable[[], Tuple[Any, Any]]) -> Dict[str, Any]:
    """Schedule one implementation and write its bundle: its manifest record, with the
    outcome (declined, error) when it could not be built."""
    import tvm

    from tvm_roller.core.errors import UnsupportedError

    out, target, dev, nvcc = settings.out, settings.target, settings.dev, settings.nvcc
    ti = time.perf_counter()
    rec: Dict[str, Any] = {}
    try:
        mod, ctx = make()
    except UnsupportedError as err:  # roller declined the function: a result, not a bug
        rec = {"declined" if impl in ROLLER_MADE else "error": _one_line(err)}
    except Exception as err:  # noqa: BLE001  (a broken schedule must not stop the others)
        rec = {"error": _one_line(err)}
    else:
        stem = f"{_safe(name)}.{impl}"
        try:
            rec = _write_impl(out, stem, mod, ctx, target, dev, nvcc)
        except Exception as err:  # noqa: BLE001
            rec = {"error": _one_line(err)}
            if kind == "chain":
                # roller's cp.async PassContext fails to lower some stitched unfused
                # chains; TVM's default one still gives roller's kernels, recorded as such
                try:
                    rec = _write_impl(out, stem, mod, tvm.transform.PassContext(), target,
                                      dev, nvcc)
                except Exception as err2:  # noqa: BLE001
                    rec["error_default_context"] = _one_line(err2)
                else:
                    rec["built_under"] = "tvm default PassContext (no cp.async)"
                    rec["roller_context_error"] = _one_line(err)
    rec["build_s"] = round(time.perf_counter() - ti, 3)
    return rec


def _build_workload(settings: _BuildSettings, name: str, kind: str,
                    wl: Optional[Tuple[str, int]], chains: Dict[str, Any],
                    hgemm: Dict[str, Callable[[], Any]]) -> Dict[str, Any]:
    """One workload's manifest entry, each of its implementations built and written."""
    plans: List[Any] = []  # a chain's roller plan, made once for both of its impls
    func, entry = _new_entry(name, kind, wl, chains, hgemm)
    makers = _impl_makers(settings, func, kind, plans)
    entry["impls"] = list(makers)
    for impl, make in makers.items():
        entry[impl] = _build_impl(settings, name, kind, impl, make)
    if plans and plans[0].fusion is not None:  # the model's decision for the chain
        fusion = plans[0].fusion
        entry["fusion"] = json.loads(json.dumps(  # plain JSON (the plan has tuples)
            {"fuse": bool(fusion.fuse), "reason": fusion.reason, "plan": fusion.model.to_dict()}))
    return entry


def _build_status(entry: Dict[str, Any]) -> str:
    """The log line's outcome of each implementation (and the model's fusion decision)."""
    status = ", ".join(f"{i}: " + ("ok" if "bundle" in entry[i] else next(
        k for k in ("declined", "error") if k in entry[i]))
        + (" (tvm default PassContext)" if entry[i].get("built_under") else "")
        for i in entry["impls"])
    if "fusion" in entry:
        status += ", " + ("fused" if entry["fusion"]["fuse"] else "not fused")
    return status


def _write_manifest(settings: _BuildSettings, entries: List[Dict[str, Any]], t_all: float,
                    log: Callable[[str], None]) -> Dict[str, Any]:
    """Write ``manifest.json`` next to the bundles; refuse a directory too big to ship."""
    import tvm

    from harness.cuda_check.build import nvcc_version

    out, nvcc = settings.out, settings.nvcc
    manifest = {
        "format": FORMAT, "arch": ARCH, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "tvm_version": tvm.__version__, "nvcc_version": nvcc_version() if nvcc else None,
        "device": json.loads(settings.dev.to_json()), "workloads": entries,
        "build_s": round(time.perf_counter() - t_all, 1),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    log(f"wrote {len(entries)} workloads to {out} ({size / 2**20:.2f} MiB)")
    if size > MAX_DIR_BYTES:
        raise SystemExit(f"{out} is {size / 2**20:.1f} MiB > {MAX_DIR_BYTES / 2**20:.0f} MiB: too "
                         "big to ship; select fewer workloads with --ops")
    return manifest


def build(out: Path, ops: Optional[str] = None, nvcc: bool = True,
          log: Callable[[str], None] = print,
          chains: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Write kernel bundles and ``manifest.json`` for the selected workloads into ``out``
    (``chains``: the GEMM chains' shapes by name, default ``CHAINS``; the tests pass small ones)."""
    out = Path(out)
    _clear_old_bundles(out)
    settings = _build_settings(out, nvcc)
    hgemm = _hgemm_funcs()
    chains = CHAINS if chains is None else chains
    entries = []
    t_all = time.perf_counter()
    for name, kind, wl in _workload_specs(ops, chains):
        t0 = time.perf_counter()
        entry = _build_workload(settings, name, kind, wl, chains, hgemm)
        entries.append(entry)
        log(f"{name:<20s} {_build_status(entry)}  ({time.perf_counter() - t0:.1f} s)")
    return _write_manifest(settings, entries, t_all, log)
