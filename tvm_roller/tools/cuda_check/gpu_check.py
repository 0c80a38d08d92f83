"""Device check of CUDA kernels: roller's schedules vs TVM's dlight default vs PyTorch, and
roller's fused GEMM chains (Chimera) vs the same operators unfused vs PyTorch, on a GPU.

Two halves, because the GPU machine has PyTorch and CuPy but no TVM:

    python python/gpu_check.py build --out gpu_bundles [--ops GMM,SFM:0,HGEMM:1024,CHAIN] [--no-nvcc]
        (here, with TVM and nvcc) For every workload (the 52 suite workloads and the fp16 GEMMs
        HGEMM:4096, HGEMM:1024, HGEMM:128x3072x768) schedule with roller (device model "h200")
        and with dlight's default GPU rules, for sm_90. For the float32 GEMM chains
        E = f(A . B) . D (``CHAINS``: CHAIN:attn512 = BERT-base attention, 12 heads x 512
        tokens x head 64 with a row softmax; CHAIN:attn512-none, the same without it;
        CHAIN:attn128 at 128 tokens; CHAIN:mlp, 128 x 768 -> 3072 -> 768 with tanh GELU) the two
        implementations are "roller" (what ``tvm_roller.schedule`` gives: the fused kernel when
        the plan's ``fusion.fuse``, else the operators one by one) and "unfused" (roller's own
        kernel for each operator, ``fusion.split.build_unfused``: several launches, the
        intermediates in workspaces); the entry records the model's decision and reason
        (``fusion``). Each entry lists its implementations (``impls``). Every module is written
        as a kernel bundle (CUDA source + launches + workspaces, see
        ``tvm_roller.tools.cuda_check.build.KernelBundle``), its cubin (a fallback when NVRTC is
        unusable on the device), and ``manifest.json`` with shapes, dtypes, named parameters,
        tolerances, ptxas data and the h200 preset. Bundles and cubins are gzip-compressed: all
        59 workloads take about 1 MiB (it is shipped to the GPU machine); about 2 minutes on 2
        cores, less when nvcc's results are cached. ``--ops`` names workloads or classes
        ("CHAIN" is every chain, "CHAIN:mlp" one).

    python python/gpu_check.py run gpu_bundles [--budget-s 420] [--ops ...] [--no-micro]
        (GPU machine: torch, cupy, numpy; never imports tvm) Measures the device constants
        (DRAM, L2 and shared-memory bandwidth, FP32 FMA peak, FP16 tensor-core peak) next to the
        preset; compiles every module up front, 8 at a time; then per workload: random inputs
        (never zero), each implementation's kernels through ``cupy.RawModule`` with the recorded
        grids/blocks/dynamic shared memory (opting in above 48 KB) and workspaces, each checked
        against PyTorch in float64 on the GPU (max error relative to the largest reference
        magnitude; the fp16 GEMMs allow 1e-2, the chains 1e-4) with outputs pre-filled with NaN,
        and timed with CUDA events (median over batches queued behind a GPU sleep, inputs
        rotated among copies so the L2 does not flatter), with the PyTorch peer (cuBLAS/cuDNN;
        fp32 with TF32 off, fp16 for the GEMMs; a chain as matmul, relu / tanh GELU / softmax
        over the last axis, matmul) timed the same way. Prints a table ("vs dlight" = dlight
        time / roller time, so > 1 means roller is faster; likewise "vs torch") with geomeans
        over the workloads where both are correct, then the chains' table ("model": fused or
        not; "fused vs unfused" = unfused time / roller time, its geomean over the chains the
        model fused; "x torch" = torch time / roller time); writes gpu_check.json and
        gpu_check.md to $OUT when it is set. Workloads not started when the budget is spent are
        reported as skipped, so it finishes in under 8 minutes on an H200.

``python/gpu_check.py`` is only the command line (``main``). On the GPU machine it imports this
module without running ``tvm_roller/__init__.py`` (which imports TVM), so nothing at module
level here, nor in ``tvm_roller/cuda_check/__init__.py``, may import TVM or the rest of
tvm_roller: the build half imports them inside its functions.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

MANIFEST = "manifest.json"
FORMAT = 1
ARCH = "sm_90"
MAX_DIR_BYTES = 32 * 2**20  # "far below" the 64 MiB a device call may carry
STATIC_SMEM_LIMIT = 48 * 1024  # above this a kernel needs the dynamic-smem opt-in attribute
FP16_TOL = 1e-2
DEVICE = "cuda"  # where run() puts tensors; the tests replay run() on "cpu" with stand-ins
HGEMMS = {"HGEMM:4096": (4096, 4096, 4096), "HGEMM:1024": (1024, 1024, 1024),
          "HGEMM:128x3072x768": (128, 3072, 768)}
# GEMM chains E = f(A . B) . D (Chimera fusion), float32: name -> (batch, m, k, l, n, middle) as
# in tvm_roller.tools.bench.chains.gemm_chain (A [*batch, m, k], B [*batch, k, l], D [*batch, l, n])
CHAINS: Dict[str, Tuple[Optional[List[int]], int, int, int, int, str]] = {
    "CHAIN:attn512": ([12], 512, 64, 512, 64, "softmax"),  # BERT-base attention, 512 tokens
    "CHAIN:attn512-none": ([12], 512, 64, 512, 64, "none"),  # the same without the softmax
    "CHAIN:attn128": ([12], 128, 64, 128, 64, "softmax"),  # 128 tokens
    "CHAIN:mlp": (None, 128, 768, 3072, 768, "gelu"),  # BERT-base MLP block, 128 tokens
}
CHAIN_TOL = 1e-4  # float32 with TVM's fast_exp in the softmax
# the implementations of a manifest entry (its "impls"; the first is roller's, the one compared):
# the suite and the fp16 GEMMs against TVM's dlight; a chain as roller builds it (fused when the
# model says it pays) against roller's own kernels for its operators one by one
SUITE_IMPLS = ("roller", "dlight")
CHAIN_IMPLS = ("roller", "unfused")
ROLLER_MADE = ("roller", "unfused")  # an UnsupportedError from these is roller declining


def _safe(name: str) -> str:
    return name.replace(":", "_")


def _write_gz(path: Path, data: bytes) -> None:
    # mtime=0: the same bundle gives the same bytes (diffable, cache friendly)
    with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
        gz.write(data)


def read_gz(path: Path) -> bytes:
    with gzip.open(path, "rb") as fh:
        return fh.read()


def load_manifest(d: Path) -> Dict[str, Any]:
    m = json.loads((Path(d) / MANIFEST).read_text())
    if m.get("format") != FORMAT:
        raise SystemExit(f"{d}/{MANIFEST} is format {m.get('format')}, expected {FORMAT}")
    return m


def impls_of(wl: Dict[str, Any]) -> List[str]:
    """The implementations a manifest entry (or result row) holds, roller's first."""
    return list(wl.get("impls") or SUITE_IMPLS)  # manifests before chains: roller and dlight


def select(workloads: List[Dict[str, Any]], ops: Optional[str]) -> List[Dict[str, Any]]:
    """Manifest entries named by ``ops`` ("GMM,SFM:0,HGEMM:1024,CHAIN:mlp"; a class names all
    its shapes)."""
    if not ops:
        return workloads
    items = [s.strip().upper() for s in ops.split(",") if s.strip()]
    return [w for w in workloads
            if any(w["name"].upper() == i or w["name"].upper().split(":")[0] == i for i in items)]


# ==============================================================================================
# build (here: TVM, tvm_roller, nvcc)
# ==============================================================================================
def _hgemm_funcs() -> Dict[str, Callable[[], Any]]:
    """fp16 GEMMs from tvm_roller.tools.suite.gpu_workloads (``HGEMMS`` repeats their shapes for the
    TVM-free run side)."""
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
    from tvm_roller.tools.cuda_check import build as cb

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


def build(out: Path, ops: Optional[str] = None, nvcc: bool = True,
          log: Callable[[str], None] = print,
          chains: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Write kernel bundles and ``manifest.json`` for the selected workloads into ``out``
    (``chains``: the GEMM chains' shapes by name, default ``CHAINS``; the tests pass small ones)."""
    import tvm

    import tvm_roller
    from tvm_roller import hardware
    from tvm_roller.core.errors import UnsupportedError
    from tvm_roller.planner import Context, apply
    from tvm_roller.fusion import split
    from tvm_roller.tools.bench.chains import gemm_chain
    from tvm_roller.tools.suite import references, workloads

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for impl in dict.fromkeys(SUITE_IMPLS + CHAIN_IMPLS):
        for old in out.glob(f"*.{impl}.*.gz"):
            old.unlink()  # bundles of an earlier build would only add to what is shipped
    target = tvm.target.Target({"tag": "nvidia/nvidia-h100", "arch": ARCH})
    dev = hardware.preset("h200")
    roller_pass_context = Context.make(target, dev).pass_context
    # roller's schedules compile under its PassContext (cp.async); dlight's under TVM's default
    hgemm = _hgemm_funcs()
    chains = CHAINS if chains is None else chains
    entries = []
    t_all = time.perf_counter()
    for name, kind, wl in _workload_specs(ops, chains):
        t0 = time.perf_counter()
        plans: List[Any] = []  # a chain's roller plan, made once for both of its impls
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

        makers = ({"roller": chain_roller, "unfused": chain_unfused} if kind == "chain"
                  else {"roller": roller, "dlight": dlight})
        entry["impls"] = list(makers)
        for impl, make in makers.items():
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
            entry[impl] = rec
        if plans and plans[0].fusion is not None:  # the model's decision for the chain
            fusion = plans[0].fusion
            entry["fusion"] = json.loads(json.dumps(  # plain JSON (the plan has tuples)
                {"fuse": bool(fusion.fuse), "reason": fusion.reason, "plan": fusion.model.to_dict()}))
        entries.append(entry)
        status = ", ".join(f"{i}: " + ("ok" if "bundle" in entry[i] else next(
            k for k in ("declined", "error") if k in entry[i]))
            + (" (tvm default PassContext)" if entry[i].get("built_under") else "")
            for i in entry["impls"])
        if "fusion" in entry:
            status += ", " + ("fused" if entry["fusion"]["fuse"] else "not fused")
        log(f"{name:<20s} {status}  ({time.perf_counter() - t0:.1f} s)")
    from tvm_roller.tools.cuda_check.build import nvcc_version

    manifest = {
        "format": FORMAT, "arch": ARCH, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "tvm_version": tvm.__version__, "nvcc_version": nvcc_version() if nvcc else None,
        "device": json.loads(dev.to_json()), "workloads": entries,
        "build_s": round(time.perf_counter() - t_all, 1),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    log(f"wrote {len(entries)} workloads to {out} ({size / 2**20:.2f} MiB)")
    if size > MAX_DIR_BYTES:
        raise SystemExit(f"{out} is {size / 2**20:.1f} MiB > {MAX_DIR_BYTES / 2**20:.0f} MiB: too "
                         "big to ship; select fewer workloads with --ops")
    return manifest


# ==============================================================================================
# run (GPU machine: torch, cupy, numpy; no TVM)
# ==============================================================================================
def nvrtc_include_dirs() -> List[str]:
    """Header directories NVRTC needs for TVM's source (``cuda/std/*`` under __CUDACC_RTC__,
    ``mma.h``, ``cuda_fp16.h``): a CUDA toolkit's include (+ its ``cccl``), else the pip
    ``nvidia-*`` wheels', else CuPy's bundled CCCL. One CCCL only: two versions would clash."""
    import glob
    import site

    roots = [os.environ.get(v) for v in ("CUDA_PATH", "CUDA_HOME")] + ["/usr/local/cuda"]
    cands: List[str] = []
    for r in filter(None, roots):
        cands += [os.path.join(r, "include"), *glob.glob(os.path.join(r, "targets", "*", "include"))]
    sites = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    for sp in sites:
        cands += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "include")))
        cands += sorted(glob.glob(os.path.join(sp, "nvidia", "cu*", "include")))
    for sp in sites:
        cands += sorted(glob.glob(os.path.join(sp, "cupy", "_core", "include", "cupy", "_cccl",
                                               "libcudacxx")))
    out: List[str] = []
    seen: set = set()
    have_cccl = False
    for c in cands:
        for d in (c, os.path.join(c, "cccl")):
            if not os.path.isdir(d) or os.path.realpath(d) in seen:
                continue
            seen.add(os.path.realpath(d))
            is_cccl = os.path.isfile(os.path.join(d, "cuda", "std", "cstdint"))
            has_other = any(os.path.isfile(os.path.join(d, h))
                            for h in ("mma.h", "cuda_fp16.h", "cuda_runtime.h"))
            if is_cccl and not have_cccl:
                out.append(d)
                have_cccl = True
            elif has_other and not is_cccl:
                out.append(d)
    return out


def load_module(cp: Any, source: str, arch: str, kernel: str,
                cubin_path: Optional[str] = None) -> Tuple[Any, str]:
    """A CuPy module for ``source``: NVRTC with ``-arch`` (what was asked for), NVRTC with CuPy's
    own arch option only (some CuPy/NVRTC versions reject a second -arch), then the cubin nvcc
    built at ``build`` time. CuPy compiles lazily, so ``get_function(kernel)`` forces it inside
    the attempt. Returns (module, how); the first way that works is tried first next time."""
    if "inc" not in _LOAD_PREF:
        _LOAD_PREF["inc"] = tuple(f"-I{d}" for d in nvrtc_include_dirs())
    opts: Tuple[str, ...] = _LOAD_PREF["inc"] + (
        "-D__NV_SILENCE_DEPRECATION_BEGIN=", "-D__NV_SILENCE_DEPRECATION_END=")
    if re.search(r"\bINFINITY\b", source):  # nvcc gets it from <math.h>, NVRTC has none
        opts += ("-DINFINITY=__int_as_float(0x7f800000)",)
    attempts: List[Tuple[str, Callable[[], Any]]] = [
        (f"nvrtc -arch={arch}", lambda: cp.RawModule(code=source, options=(f"-arch={arch}",) + opts)),
        ("nvrtc", lambda: cp.RawModule(code=source, options=opts)),
    ]
    if cubin_path:
        attempts.append(("cubin", lambda: cp.RawModule(path=cubin_path)))
    attempts.sort(key=lambda a: a[0] != _LOAD_PREF.get("how"))
    errors = []
    for how, make in attempts:
        try:
            mod = make()
            mod.get_function(kernel)
            _LOAD_PREF["how"] = how
            return mod, how
        except Exception as err:  # noqa: BLE001
            errors.append(f"{how}: {type(err).__name__}: {str(err).strip()[-600:]}")
    raise RuntimeError("cannot load the CUDA module; " + " | ".join(errors))


_LOAD_PREF: Dict[str, Any] = {}


class Launcher:
    """Runs a kernel bundle (the dict of ``KernelBundle.to_json``) with CuPy, no TVM.

    ``params`` are the entry function's arguments in order: device arrays (CuPy arrays, or
    anything CuPy accepts as a pointer argument) for buffers, numbers for scalars. Workspaces
    are allocated once as raw bytes (the kernels only need the pointer; TVM does not clear
    them either) and reused by every call; all launches go to CuPy's current stream."""

    def __init__(self, bundle: Dict[str, Any], cp: Any, arch: str = ARCH,
                 cubin_path: Optional[str] = None, module: Optional[Tuple[Any, str]] = None):
        self.cp = cp
        self.bundle = bundle
        launches = bundle["launches"]
        if not launches:
            raise ValueError("the bundle launches no kernel")
        # ``module``: (module, how) from ``load_module`` when it was compiled ahead
        self.module, self.how = module or load_module(cp, bundle["source"], arch,
                                                      launches[0]["name"], cubin_path)
        self.functions: Dict[str, Any] = {}
        for launch in launches:
            name = launch["name"]
            if name not in self.functions:
                fn = self.module.get_function(name)
                smem = max(int(l["dyn_smem_bytes"]) for l in launches if l["name"] == name)
                if smem > STATIC_SMEM_LIMIT:  # opt in to more than 48 KB of dynamic smem
                    fn.max_dynamic_shared_size_bytes = smem
                self.functions[name] = fn
        self.workspaces = [cp.empty((max(1, _nbytes(w["dtype"], w["count"])),), dtype=cp.uint8)
                           for w in bundle["workspaces"]]

    def prepare(self, params: Sequence[Any]) -> List[Tuple[Any, tuple, tuple, tuple, int]]:
        """The launches with ``params`` bound: [(function, grid, block, args, dyn smem)]."""
        specs = self.bundle["params"]
        if len(params) != len(specs):
            raise ValueError(f"{len(params)} arguments for {len(specs)} parameters")
        out = []
        for launch in self.bundle["launches"]:
            args = []
            for a in launch["args"]:
                if a["kind"] == "param":
                    v = params[a["index"]]
                    scalar = specs[a["index"]]["kind"] == "scalar"
                    args.append(np.dtype(a["dtype"]).type(v) if scalar else v)
                elif a["kind"] == "workspace":
                    args.append(self.workspaces[a["index"]])
                elif a["kind"] == "scalar":
                    args.append(np.dtype(a["dtype"]).type(a["value"]))
                else:
                    raise ValueError(f"unknown kernel argument kind {a['kind']!r}")
            out.append((self.functions[launch["name"]], tuple(launch["grid"]), tuple(launch["block"]),
                        tuple(args), int(launch["dyn_smem_bytes"])))
        return out

    @staticmethod
    def launch(prepared: Sequence[Tuple[Any, tuple, tuple, tuple, int]]) -> None:
        for fn, grid, block, args, smem in prepared:
            fn(grid, block, args, shared_mem=smem)

    def __call__(self, params: Sequence[Any]) -> None:
        self.launch(self.prepare(params))


def _nbytes(dtype: str, count: int) -> int:
    bits = {"bool": 8}.get(dtype)
    if bits is None:
        digits = "".join(ch for ch in dtype.split("x")[0] if ch.isdigit())
        lanes = int(dtype.split("x")[1]) if "x" in dtype else 1
        bits = int(digits or 32) * lanes
    return (bits * int(count) + 7) // 8


# -- PyTorch ops (the reference in float64 and the peer in float32) -----------------------------
# Same semantics as tvm_roller/suite/references.py (checked against each other in
# tests/tools/cuda_check/test_gpu_check.py); written here because the GPU machine has no TVM.
def torch_op(cls: str, p: Dict[str, int],
             xs: Sequence[Any]) -> Tuple[Callable[[], Any], Callable[[Any], Any]]:
    """``(fn, to_tvm)`` for workload class ``cls`` with named parameters ``p`` on tensors ``xs``
    (any device/dtype, TVM layouts): ``fn()`` computes the op only (layout permutations of the
    inputs are done here, once, outside it); ``to_tvm(fn())`` is the result in TVM's layout."""
    import torch
    import torch.nn.functional as F

    def conv_nd(nd: int, x, w, groups: int):
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
        xt = x.permute((0, nd + 1) + tuple(range(1, nd + 1))).contiguous()
        # [k.., CI/g, CO] -> [CO, CI/g, k..]
        wt = w.permute((nd + 1, nd) + tuple(range(nd))).contiguous()
        back = (0,) + tuple(range(2, nd + 2)) + (1,)
        return (lambda: conv(xt, wt, None, p["stride"], p["pad"], p["dil"], groups),
                lambda y: y.permute(back).contiguous())

    if cls == "C1D":
        return conv_nd(1, xs[0], xs[1], p["groups"])
    if cls in ("C2D", "GRP", "DIL"):
        return conv_nd(2, xs[0], xs[1], p["groups"])
    if cls == "C3D":
        return conv_nd(3, xs[0], xs[1], p["groups"])
    if cls == "DEP":
        xt = xs[0].permute(0, 3, 1, 2).contiguous()
        wt = xs[1][0].permute(2, 0, 1).unsqueeze(1).contiguous()  # [1,KH,KW,C] -> [C,1,KH,KW]
        return (lambda: F.conv2d(xt, wt, None, p["stride"], p["pad"], p["dil"], p["c"]),
                lambda y: y.permute(0, 2, 3, 1).contiguous())
    if cls == "T2D":
        xt = xs[0].permute(0, 3, 1, 2).contiguous()
        wt = xs[1].permute(2, 3, 0, 1).contiguous()  # [KH,KW,CI,CO] -> [CI,CO,KH,KW]
        return (lambda: F.conv_transpose2d(xt, wt, None, p["stride"], p["pad"]),
                lambda y: y.permute(0, 2, 3, 1).contiguous())
    if cls == "CAP":
        n, h, w, ci, co, k, cap = (p[q] for q in ("n", "h", "w", "ci", "co", "k", "capsule"))
        # x[n,h,w,i,k,rc] -> [(n,i), (k,rc), h, w]; w[rh,rw,k,j,rc,co] -> [(j,co), (k,rc), rh, rw]
        xt = xs[0].permute(0, 3, 4, 5, 1, 2).reshape(n * cap, cap * ci, h, w).contiguous()
        wt = xs[1].permute(3, 5, 2, 4, 0, 1).reshape(cap * co, cap * ci, k, k).contiguous()

        def cap_back(y):
            oh, ow = y.shape[-2:]
            return y.reshape(n, cap, cap, co, oh, ow).permute(0, 4, 5, 1, 2, 3).contiguous()

        return lambda: F.conv2d(xt, wt, None, p["stride"], p["pad"]), cap_back
    if cls == "CBR":
        xt = xs[0].permute(0, 3, 1, 2).contiguous()
        wt = xs[1].permute(3, 2, 0, 1).contiguous()
        bias = xs[2].reshape(-1)
        offset, scale = xs[3].reshape(-1, 1, 1), xs[4].reshape(-1, 1, 1)  # args: bias, offset, scale
        def cbr():
            conv = F.conv2d(xt, wt, bias, p["stride"], p["pad"], p["dil"])
            return torch.relu_(torch.addcmul(offset, conv, scale))

        return cbr, lambda y: y.permute(0, 2, 3, 1).contiguous()
    if cls == "GMM":
        return (lambda: torch.bmm(xs[0], xs[1])), (lambda z: z)
    if cls == "TBG":  # the transposes are part of the op: strided views inside the call
        return (lambda: torch.matmul(xs[0].permute(0, 2, 1, 3), xs[1].permute(0, 2, 3, 1)),
                lambda z: z.contiguous())
    if cls == "NRM":
        return (lambda: torch.linalg.vector_norm(xs[0], dim=(1, 2))), (lambda d: d)
    if cls == "SFM":
        return (lambda: torch.softmax(xs[0], dim=1)), (lambda b: b)
    if cls == "HGEMM":
        return (lambda: torch.matmul(xs[0], xs[1])), (lambda c: c)
    if cls == "CHAIN":  # E = f(A . B) . D, f as in tvm_roller.tools.bench.chains.middle_stage
        a, b, d = xs
        middle = p["middle"]
        if middle == "gelu" and a.dtype == torch.float64:
            # the reference: the chain's own definition, constant and all
            def mid(c):
                return 0.5 * c * (1.0 + torch.tanh(0.7978845608 * (c + 0.044715 * c ** 3)))
        elif middle == "gelu":  # the peer: PyTorch's fused tanh-form GELU (sqrt(2/pi) exactly)
            def mid(c):
                return F.gelu(c, approximate="tanh")
        elif middle == "relu":
            mid = torch.relu
        elif middle == "softmax":
            def mid(c):
                return torch.softmax(c, dim=-1)
        elif middle == "none":
            def mid(c):
                return c
        else:
            raise ValueError(f"unknown chain middle {middle!r}")
        return (lambda: torch.matmul(mid(torch.matmul(a, b)), d)), (lambda e: e)
    raise ValueError(f"no torch op for class {cls!r}")


def rel_error(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| (inf for a wrong shape or a non-finite output)."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    o = out.to(torch.float64)
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    err = float((o - ref).abs().max()) if ref.numel() else 0.0
    return err / scale if scale > 0 else err


def random_tensor(shape: Sequence[int], dtype: str, gen: Any, device: Optional[str] = None) -> Any:
    """Uniform(-1, 1) without exact zeros (a zero input hides reading padding for data)."""
    import torch

    x = torch.rand(tuple(shape), generator=gen, device=device or DEVICE, dtype=torch.float32) * 2 - 1
    x = x.to(getattr(torch, dtype))
    x[x == 0] = 0.5
    return x


# -- timing ------------------------------------------------------------------------------------
def time_calls(call: Callable[[int], None], budget_s: float = 0.25, min_batches: int = 5,
               max_batches: int = 30, batch_us: float = 300.0) -> Dict[str, float]:
    """Median GPU time of ``call(k)`` (k rotates the input copies) in microseconds.

    Calls run in batches between two CUDA events; a batch is queued behind a GPU sleep so the
    CPU's launch overhead does not leave gaps between kernels. The batch size makes a batch
    ~``batch_us``; the number of batches fits ``budget_s`` (within [min, max])."""
    import torch

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call(0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    e0.record()
    for i in range(3):
        call(i)
    e1.record()
    cpu_us = (time.perf_counter() - t) / 3 * 1e6
    e1.synchronize()
    est_us = max(e0.elapsed_time(e1) * 1e3 / 3, 1.0)
    batch = int(min(200, max(1, batch_us // est_us)))
    # a pathologically slow kernel (seconds) gets fewer than min_batches rather than minutes
    min_batches = max(1, min(min_batches, int(4 * budget_s * 1e6 // est_us)))
    nb = int(min(max_batches, max(min_batches, budget_s * 1e6 // (batch * est_us))))
    sleep = getattr(torch.cuda, "_sleep", None)
    ghz = 1.5
    times, k = [], 3
    for _ in range(nb):
        if sleep is not None:  # keep the GPU busy while the CPU queues the batch
            sleep(int(min(20000.0, batch * cpu_us * 1.5 + 50) * ghz * 1e3))
        e0.record()
        for _ in range(batch):
            call(k)
            k += 1
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / batch)
    return {"us": statistics.median(times), "batch": batch, "batches": nb,
            "min_us": min(times)}


def n_copies(set_bytes: int, l2_bytes: int, cap_bytes: int = 2**30, most: int = 32) -> int:
    """Input copies to rotate: enough to cover 3x the L2 when they fit ``cap_bytes``."""
    want = math.ceil(3 * l2_bytes / max(1, set_bytes))
    return int(max(1, min(most, want, cap_bytes // max(1, set_bytes))))


# -- micro-benchmarks --------------------------------------------------------------------------
_SMEM_KERNEL = r"""
extern "C" __global__ void smem_bw(float* out, int iters) {
  __shared__ float4 buf[1024];
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) buf[i] = make_float4(i, i + 1, i + 2, i + 3);
  __syncthreads();
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  int idx = threadIdx.x;
  for (int it = 0; it < iters; ++it) {
    // consecutive lanes read consecutive 16-byte words: conflict-free, 512 B per warp
    float4 v = buf[idx];
    acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    idx = (idx + 32 + (it & 1)) & 1023;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc.x + acc.y + acc.z + acc.w;
}
"""
_L2_KERNEL = r"""
extern "C" __global__ void l2_read(const float4* __restrict__ src, float* out, int n4, int reps) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  int stride = gridDim.x * blockDim.x;
  for (int r = 0; r < reps; ++r) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
      float4 v = __ldcg(src + i);  // cached in L2 only: L1 hits must not count
      acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc.x + acc.y + acc.z + acc.w;
}
"""
_FMA_KERNEL = r"""
extern "C" __global__ void fma_peak(float* out, int iters, float a, float b) {
  float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3;
  float x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < 16; ++u) {  // 8 independent chains hide the FMA latency
      x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
      x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}
"""


def micro_benchmarks(cp: Any, preset: Dict[str, Any], budget_s: float = 30.0) -> List[Dict[str, Any]]:
    """Measured device constants next to the preset's (ratio = measured / preset)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    levels = {lv["name"]: lv for lv in preset["levels"]}
    rows: List[Dict[str, Any]] = []
    t_end = time.perf_counter() + budget_s

    def add(name: str, unit: str, measured: float, model: Optional[float], how: str) -> None:
        rows.append({"name": name, "unit": unit, "measured": measured, "preset": model,
                     "ratio": (measured / model) if model else None, "how": how})

    def best_of(fn: Callable[[], None], reps: int) -> float:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) / 1e3)
            if time.perf_counter() > t_end:
                break
        return statistics.median(ts)

    steps = [
        ("DRAM bandwidth", "GB/s", "DRAM", "copy of 1 GiB (read + write)"),
        ("L2 bandwidth", "GB/s", "L2", "16 MiB read 64 times with ld.cg (L2 resident)"),
        ("SMEM bandwidth per SM", "GB/s", "SMEM", "conflict-free 16-byte shared loads"),
        ("FP32 peak", "GFLOP/s", "float32", "8 independent FMA chains per thread"),
        ("FP16 tensor-core peak", "GFLOP/s", "float16_tc", "torch fp16 matmul 8192^3"),
    ]
    for name, unit, key, how in steps:
        try:
            if key == "DRAM":
                n = 2**28  # float32 elements = 1 GiB
                src, dst = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
                src.fill_(1.0)
                t = best_of(lambda: dst.copy_(src), 10)
                add(name, unit, 2 * n * 4 / t / 1e9, levels["DRAM"]["bandwidth_gbs"], how)
                del src, dst
            elif key == "L2":
                mod, _ = load_module(cp, _L2_KERNEL, ARCH, "l2_read")
                fn = mod.get_function("l2_read")
                n4, reps = 2**20, 64  # 16 MiB, a third of the L2, read 64 times
                src = cp.ones((n4 * 4,), dtype=cp.float32)
                blocks, threads = sms * 4, 512
                out = cp.empty((blocks * threads,), dtype=cp.float32)
                args = (src, out, np.int32(n4), np.int32(reps))
                t = best_of(lambda: fn((blocks,), (threads,), args), 10)
                add(name, unit, n4 * 16 * reps / t / 1e9, levels["L2"]["bandwidth_gbs"], how)
            elif key == "SMEM":
                mod, _ = load_module(cp, _SMEM_KERNEL, ARCH, "smem_bw")
                fn = mod.get_function("smem_bw")
                blocks, threads, iters = sms * 4, 512, 8192
                out = cp.empty((blocks * threads,), dtype=cp.float32)
                t = best_of(lambda: fn((blocks,), (threads,), (out, np.int32(iters))), 10)
                total = blocks * threads * iters * 16 / t / 1e9
                add(name, unit, total / sms, levels["SMEM"]["bandwidth_gbs"],
                    how + f" (device total {total:.0f} GB/s)")
            elif key == "float32":
                mod, _ = load_module(cp, _FMA_KERNEL, ARCH, "fma_peak")
                fn = mod.get_function("fma_peak")
                blocks, threads, iters = sms * 8, 256, 2048
                out = cp.empty((blocks * threads,), dtype=cp.float32)
                args = (out, np.int32(iters), np.float32(0.999), np.float32(0.001))
                t = best_of(lambda: fn((blocks,), (threads,), args), 10)
                flops = 2 * 8 * 16 * iters * blocks * threads
                add(name, unit, flops / t / 1e9, preset["peak_gflops"]["float32"], how)
            else:
                n = 8192
                a = torch.randn(n, n, device="cuda", dtype=torch.float16)
                b = torch.randn(n, n, device="cuda", dtype=torch.float16)
                t = best_of(lambda: torch.matmul(a, b), 10)
                add(name, unit, 2 * n**3 / t / 1e9, preset["peak_gflops"].get("float16_tc"), how)
                del a, b
        except Exception as err:  # noqa: BLE001
            rows.append({"name": name, "unit": unit, "error": f"{type(err).__name__}: {err}"[:300]})
        torch.cuda.empty_cache()
    return rows


# -- per workload ------------------------------------------------------------------------------
def _load_impl(d: Path, info: Dict[str, Any],
               cp: Any) -> Tuple[Dict[str, Any], Optional[str], Tuple[Any, str], float]:
    """Read one implementation's bundle (and cubin) and compile/load its module:
    (bundle, cubin path, (module, how), seconds)."""
    import tempfile

    t0 = time.perf_counter()
    bundle = json.loads(read_gz(d / info["bundle"]))
    cubin_path = None
    if info.get("cubin"):
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
            fh.write(read_gz(d / info["cubin"]))
            cubin_path = fh.name
    module = load_module(cp, bundle["source"], ARCH, bundle["launches"][0]["name"], cubin_path)
    return bundle, cubin_path, module, time.perf_counter() - t0


def load_all(wls: List[Dict[str, Any]], d: Path, cp: Any, workers: int = 8,
             budget_s: float = 150.0) -> Dict[Tuple[str, str], Any]:
    """Compile every bundle's module up front, ``workers`` at a time (NVRTC runs without the
    GIL), before anything is timed: no compile thread competes with the timing loop. Maps
    (workload, impl) to ``_load_impl``'s result or the exception; what the budget did not
    reach is missing and is loaded on demand."""
    from concurrent.futures import ThreadPoolExecutor, wait

    jobs = [(wl["name"], impl, wl[impl]) for wl in wls for impl in impls_of(wl)
            if "bundle" in wl.get(impl, {})]
    if not jobs:
        return {}
    # the first load settles which route (NVRTC options / cubin) works; the rest follow it
    first = jobs[0]
    out: Dict[Tuple[str, str], Any] = {}
    try:
        out[first[:2]] = _load_impl(d, first[2], cp)
    except Exception as err:  # noqa: BLE001
        out[first[:2]] = err
    ex = ThreadPoolExecutor(max_workers=workers)
    futs = {ex.submit(_load_impl, d, info, cp): (name, impl) for name, impl, info in jobs[1:]}
    done, _ = wait(futs, timeout=budget_s)
    for f in done:
        try:
            out[futs[f]] = f.result()
        except Exception as err:  # noqa: BLE001
            out[futs[f]] = err
    ex.shutdown(wait=False, cancel_futures=True)
    return out


def check_workload(wl: Dict[str, Any], d: Path, cp: Any, l2_bytes: int,
                   budget_s: float = 0.25,
                   loaded: Optional[Dict[Tuple[str, str], Any]] = None) -> Dict[str, Any]:
    """Correctness and time of each implementation of one workload (roller's and dlight's, or a
    chain's roller and unfused) and of PyTorch's version."""
    import torch

    loaded = loaded if loaded is not None else {}
    row: Dict[str, Any] = {"name": wl["name"], "flops": wl["flops"], "bytes": wl["bytes"],
                           **_row_info(wl)}
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(0)
    (out_shape, out_dtype), in_specs = wl["args"][-1], wl["args"][:-1]
    inputs = [random_tensor(s, dt, gen) for s, dt in in_specs]
    fn64, back64 = torch_op(wl["cls"], wl["params"], [x.to(torch.float64) for x in inputs])
    ref = back64(fn64())
    set_bytes = wl["bytes"]
    copies = n_copies(set_bytes, l2_bytes)
    sets = [inputs] + [[x.clone() for x in inputs] for _ in range(copies - 1)]
    outs = [torch.full(tuple(out_shape), float("nan"), device=DEVICE, dtype=getattr(torch, out_dtype))
            for _ in range(copies)]
    row["copies"] = copies
    tol = float(wl["tol"])
    for impl in impls_of(wl):
        info = wl.get(impl, {})
        res: Dict[str, Any] = {}
        row[impl] = res
        if "bundle" not in info:
            res["status"] = "declined" if "declined" in info else "build-error"
            res["reason"] = info.get("declined") or info.get("error", "not built")
            continue
        try:
            pre = loaded.get((wl["name"], impl))
            if pre is None or isinstance(pre, Exception):  # not reached, or failed in a thread
                pre = _load_impl(d, info, cp)
            bundle, cubin_path, module, load_s = pre
            if info.get("built_under"):
                res["built_under"] = info["built_under"]
            launcher = Launcher(bundle, cp, ARCH, cubin_path, module=module)
            res["load_s"] = round(load_s, 2)
            res["loaded_by"] = launcher.how
            prepared = [launcher.prepare([cp.asarray(t) for t in s + [o]]) for s, o in zip(sets, outs)]
            outs[0].fill_(float("nan"))  # an element the kernels never write stays NaN and fails
            launcher.launch(prepared[0])
            torch.cuda.synchronize()
            res["rel_err"] = rel_error(outs[0], ref)
            res["status"] = "ok" if res["rel_err"] <= tol else "wrong"
            res.update(time_calls(lambda k: launcher.launch(prepared[k % copies]), budget_s))
        except Exception as err:  # noqa: BLE001
            res["status"] = "run-error"
            res["reason"] = f"{type(err).__name__}: {err}"[:500]
            torch.cuda.synchronize()
    res = {}
    row["torch"] = res
    try:
        dt = getattr(torch, out_dtype) if wl["kind"] == "hgemm" else torch.float32
        peers = [torch_op(wl["cls"], wl["params"], [x.to(dt) for x in s]) for s in sets]
        res["rel_err"] = rel_error(peers[0][1](peers[0][0]()), ref)
        res["status"] = "ok" if res["rel_err"] <= tol else "wrong"
        res.update(time_calls(lambda k: peers[k % copies][0](), budget_s))
    except Exception as err:  # noqa: BLE001
        res["status"] = "run-error"
        res["reason"] = f"{type(err).__name__}: {err}"[:500]
    return row


def _row_info(wl: Dict[str, Any]) -> Dict[str, Any]:
    """What a result row repeats from its manifest entry beyond the name."""
    info: Dict[str, Any] = {"kind": wl.get("kind", "suite"), "impls": impls_of(wl)}
    if "fusion" in wl:
        info["fusion"] = {k: wl["fusion"][k] for k in ("fuse", "reason")}
    return info


def _fmt_us(v: Optional[float]) -> str:
    return "-" if v is None else (f"{v:.1f}" if v < 1000 else f"{v:.0f}")


def _speedup(row: Dict[str, Any], other: str, base: str = "roller") -> Optional[float]:
    """``other``'s time / ``base``'s time when both are correct (> 1: ``base`` is faster)."""
    r, o = row.get(base, {}), row.get(other, {})
    if r.get("status") == "ok" and o.get("status") == "ok" and r.get("us") and o.get("us"):
        return o["us"] / r["us"]
    return None


def _geomean(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _status(res: Dict[str, Any]) -> str:
    s = res.get("status", "-")
    if s == "ok":
        return "ok"
    if s == "wrong":
        return f"ERR {res['rel_err']:.1e}"
    return {"declined": "declined", "build-error": "build-err", "run-error": "run-err",
            "skipped": "skipped"}.get(s, s)


def _grid(head: List[str], body: List[List[Any]]) -> Tuple[List[str], List[str]]:
    """(plain-text lines, markdown lines) of a table: the first column left-aligned."""
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    text = [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(str(c) for c in b) + " |" for b in body]
    return text, md


def _fmt_x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


# column titles of a chain's speed-ups (peer time / roller time); other peers get "vs <name>"
CHAIN_LABELS = {"unfused": "fused vs unfused", "torch": "x torch"}


def chain_table(rows: List[Dict[str, Any]]) -> Tuple[List[str], List[str], Dict[str, Any]]:
    """(text lines, markdown lines, summary) of GEMM-chain rows: each implementation of the row
    (``impls``, roller's first) and PyTorch, with the model's decision ("model": fused or not)
    and roller's speed-up over each of the others. Where the model declined to fuse, roller's
    kernels are the unfused ones: "fused vs unfused" is then about 1 by construction, so its
    geomean counts the chains the model fused only."""
    impls = impls_of(rows[0])
    base, peers = impls[0], impls[1:] + ["torch"]
    if any(impls_of(r) != impls for r in rows):
        raise ValueError(f"chain rows with different implementations: {[impls_of(r) for r in rows]}")
    labels = [CHAIN_LABELS.get(q, f"vs {q}") for q in peers]
    head = (["chain", "model"] + impls + ["torch"] + [f"{i} us" for i in impls + ["torch"]]
            + labels)
    fused = lambda r: bool(r.get("fusion", {}).get("fuse"))
    body = []
    for r in rows:
        model = ("fused" if fused(r) else "unfused") if "fusion" in r else "-"
        mark = lambda res: _status(res) + ("*" if res.get("built_under") else "")
        body.append([r["name"], model] + [mark(r.get(i, {})) for i in impls + ["torch"]]
                    + [_fmt_us(r.get(i, {}).get("us")) for i in impls + ["torch"]]
                    + [_fmt_x(_speedup(r, q, base)) for q in peers])
    summary: Dict[str, Any] = {
        "chains": len(rows), "fused": [r["name"] for r in rows if fused(r)],
        f"{base}_ok": sum(r.get(base, {}).get("status") == "ok" for r in rows),
        f"{base}_wrong": [r["name"] for r in rows if r.get(base, {}).get("status") == "wrong"]}
    gm = ["geomean", ""] + [""] * 2 * (len(impls) + 1)
    for q, label in zip(peers, labels):
        among = [r for r in rows if fused(r)] if q in impls else rows
        key = "geomean_" + label.replace(" ", "_")
        summary[key] = _geomean([_speedup(r, q, base) for r in among])
        summary["n_" + label.replace(" ", "_")] = sum(_speedup(r, q, base) is not None
                                                      for r in among)
        gm.append(_fmt_x(summary[key]))
        if q != "torch":
            summary[f"{q}_ok"] = sum(r.get(q, {}).get("status") == "ok" for r in rows)
    text, md = _grid(head, body + [gm])
    note = (f'"{labels[0]}" = {peers[0]} us / {base} us (> 1: {base} is faster); its geomean '
            f"over the chains the model fused only ({base} = {peers[0]} elsewhere)")
    notes = [note]
    if any(r.get(i, {}).get("built_under") for r in rows for i in impls):
        notes.append("* built under TVM's default PassContext: roller's (cp.async) failed to "
                     "lower it (the manifest has the error)")
    summary["built_under_default_context"] = [f"{r['name']}/{i}" for r in rows for i in impls
                                              if r.get(i, {}).get("built_under")]
    return (["GEMM chains"] + text + notes, ["", "GEMM chains", ""] + md + [""] + notes,
            summary)


def table(rows: List[Dict[str, Any]], micro: List[Dict[str, Any]]) -> Tuple[str, str, Dict[str, Any]]:
    """(plain text, markdown, summary) of the results: the suite and fp16 GEMMs (roller vs
    dlight vs torch), then the GEMM chains (``chain_table``; summary["chains"])."""
    chains = [r for r in rows if r.get("kind") == "chain"]
    rows = [r for r in rows if r.get("kind") != "chain"]
    head = ["workload", "roller", "dlight", "torch", "roller us", "dlight us", "torch us",
            "vs dlight", "vs torch"]
    body = []
    for r in rows:
        sd, st = _speedup(r, "dlight"), _speedup(r, "torch")
        body.append([r["name"], _status(r.get("roller", {})), _status(r.get("dlight", {})),
                     _status(r.get("torch", {})), _fmt_us(r.get("roller", {}).get("us")),
                     _fmt_us(r.get("dlight", {}).get("us")), _fmt_us(r.get("torch", {}).get("us")),
                     _fmt_x(sd), _fmt_x(st)])
    summary = {
        "geomean_vs_dlight": _geomean([_speedup(r, "dlight") for r in rows]),
        "geomean_vs_torch": _geomean([_speedup(r, "torch") for r in rows]),
        "n_vs_dlight": sum(_speedup(r, "dlight") is not None for r in rows),
        "n_vs_torch": sum(_speedup(r, "torch") is not None for r in rows),
        "roller_ok": sum(r.get("roller", {}).get("status") == "ok" for r in rows),
        "roller_wrong": [r["name"] for r in rows if r.get("roller", {}).get("status") == "wrong"],
        "dlight_ok": sum(r.get("dlight", {}).get("status") == "ok" for r in rows),
        "workloads": len(rows),
    }
    gm = ["geomean", "", "", "", "", "", "", _fmt_x(summary["geomean_vs_dlight"]),
          _fmt_x(summary["geomean_vs_torch"])]
    text, md = _grid(head, body + [gm]) if rows or not chains else ([], [])
    if chains:
        ctext, cmd, summary["chains"] = chain_table(chains)
        text += ([""] if text else []) + ctext
        md += cmd if md else cmd[3:]
    mtext, mmd = [], []
    if micro:
        mtext.append("device constants (measured vs preset h200)")
        mmd += ["", "| constant | measured | preset | measured/preset | how |", "|---|---|---|---|---|"]
        for m in micro:
            if "error" in m:
                mtext.append(f"  {m['name']:<24s} error: {m['error']}")
                mmd.append(f"| {m['name']} | error | | | {m['error']} |")
                continue
            ratio = "-" if m["ratio"] is None else f"{m['ratio']:.2f}"
            pre = "-" if m["preset"] is None else f"{m['preset']:.0f}"
            mtext.append(f"  {m['name']:<24s} {m['measured']:>10.0f} {m['unit']:<8s} "
                         f"preset {pre:>8s}  ratio {ratio}  ({m['how']})")
            mmd.append(f"| {m['name']} ({m['unit']}) | {m['measured']:.0f} | {pre} | {ratio} "
                       f"| {m['how']} |")
    return "\n".join(mtext + [""] + text), "\n".join(md + mmd), summary


def _run_workloads(wls: List[Dict[str, Any]], d: Path, cp: Any, l2: int, per_impl_s: float,
                   deadline: float, log: Callable[[str], None]) -> List[Dict[str, Any]]:
    import torch

    t0 = time.perf_counter()
    loaded = load_all(wls, d, cp, budget_s=max(10.0, (deadline - t0) * 0.4))
    log(f"compiled {len(loaded)} modules in {time.perf_counter() - t0:.1f} s "
        f"({sum(isinstance(v, Exception) for v in loaded.values())} failed: retried on demand)")
    rows = []
    for i, wl in enumerate(wls):
        if deadline - time.perf_counter() < 15.0:  # out of time: report the rest as skipped
            rows.append({"name": wl["name"], **_row_info(wl),
                         **{k: {"status": "skipped", "reason": "time budget"}
                            for k in impls_of(wl) + ["torch"]}})
            continue
        t0 = time.perf_counter()
        try:
            row = check_workload(wl, d, cp, l2, per_impl_s, loaded)
        except Exception as err:  # noqa: BLE001  (e.g. the reference itself failed)
            row = {"name": wl["name"], **_row_info(wl),
                   "error": f"{type(err).__name__}: {err}"[:500]}
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        log(f"[{i + 1}/{len(wls)}] {wl['name']:<20s} " + "  ".join(
            f"{k}={_status(row.get(k, {}))}/{_fmt_us(row.get(k, {}).get('us'))}us"
            for k in impls_of(wl) + ["torch"]) + f"  ({row['wall_s']} s)")
        torch.cuda.empty_cache()
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def run(d: Path, ops: Optional[str] = None, budget_s: float = 420.0, micro: bool = True,
        per_impl_s: float = 0.25, out_dir: Optional[str] = None,
        log: Callable[[str], None] = print) -> Dict[str, Any]:
    import cupy as cp
    import torch

    t_start = time.perf_counter()
    d = Path(d)
    manifest = load_manifest(d)
    wls = select(manifest["workloads"], ops)
    torch.backends.cuda.matmul.allow_tf32 = False  # the peer computes in true fp32, as the kernels
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cudnn.benchmark = True  # cuDNN at its best: autotuned in the untimed first call
    props = torch.cuda.get_device_properties(0)
    device = {"name": props.name, "sms": props.multi_processor_count,
              "memory_gib": round(props.total_memory / 2**30, 1),
              "cc": f"{props.major}.{props.minor}", "torch": torch.__version__,
              "cupy": cp.__version__, "cuda": torch.version.cuda}
    log(f"device: {device}")
    l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
    # one stream for CuPy's launches, PyTorch's ops, the GPU sleeps and the timing events
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), cp.cuda.ExternalStream(stream.cuda_stream):
        micro_rows = []
        if micro:
            micro_rows = micro_benchmarks(cp, manifest["device"], budget_s=min(40.0, budget_s / 8))
        for m in micro_rows:
            log(f"  {m['name']}: " + (m.get("error")
                                      or f"{m['measured']:.0f} {m['unit']} (preset {m['preset']})"))
        rows = _run_workloads(wls, d, cp, l2, per_impl_s, t_start + budget_s, log)
    text, md, summary = table(rows, micro_rows)
    summary["wall_s"] = round(time.perf_counter() - t_start, 1)
    log(text)
    log(f"summary: {json.dumps(summary)}")
    result = {"device": device, "micro": micro_rows, "rows": rows, "summary": summary,
              "manifest": {k: manifest[k] for k in ("created", "tvm_version", "nvcc_version", "arch")}}
    out_dir = out_dir or os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
        (Path(out_dir) / "gpu_check.md").write_text(md + "\n")
    return result


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="schedule, lower and write kernel bundles (needs TVM)")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--ops", default=None, help="e.g. 'GMM,SFM:0,HGEMM:1024' (default: all)")
    b.add_argument("--no-nvcc", action="store_true", help="skip nvcc (no cubins, no ptxas data)")
    r = sub.add_parser("run", help="run the bundles on the GPU (torch + cupy, no TVM)")
    r.add_argument("dir", type=Path)
    r.add_argument("--ops", default=None)
    r.add_argument("--budget-s", type=float, default=420.0, help="stop timing new workloads after this")
    r.add_argument("--per-impl-s", type=float, default=0.25, help="GPU time to spend timing one kernel")
    r.add_argument("--no-micro", action="store_true", help="skip the device-constant micro-benchmarks")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.out, a.ops, nvcc=not a.no_nvcc)
    else:
        run(a.dir, a.ops, a.budget_s, not a.no_micro, a.per_impl_s)

