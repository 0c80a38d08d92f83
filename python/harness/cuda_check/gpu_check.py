"""Device check of CUDA kernels: roller's schedules vs TVM's dlight default vs PyTorch, and
roller's fused GEMM chains (Chimera) vs the same operators unfused vs PyTorch, on a GPU.

Two halves, because the GPU machine has PyTorch and CuPy but no TVM:

    python python/gpu_check.py build --out gpu_bundles [--ops GMM,SFM:0,HGEMM:1024,CHAIN] [--no-nvcc]
        (here, with TVM and nvcc) For every workload (the 52 suite workloads and the fp16 GEMMs
        HGEMM:4096, HGEMM:1024, HGEMM:128x3072x768) schedule with roller (device model "h200")
        and with dlight's default GPU rules, for sm_90. For the float32 GEMM chains
        E = f(A . B) . D (``gpu_bundles.CHAINS``: CHAIN:attn512 = BERT-base attention, 12 heads
        x 512 tokens x head 64 with a row softmax; CHAIN:attn512-none, the same without it;
        CHAIN:attn128 at 128 tokens; CHAIN:mlp, 128 x 768 -> 3072 -> 768 with tanh GELU) the two
        implementations are "roller" (what ``tvm_roller.schedule`` gives: the fused kernel when
        the plan's ``fusion.fuse``, else the operators one by one) and "unfused" (roller's own
        kernel for each operator, ``fusion.split.build_unfused``: several launches, the
        intermediates in workspaces); the entry records the model's decision and reason
        (``fusion``). Each entry lists its implementations (``impls``). Every module is written
        as a kernel bundle (CUDA source + launches + workspaces, see
        ``harness.cuda_check.build.KernelBundle``), its cubin (a fallback when NVRTC is
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

This module is the entry: ``run`` and ``main`` (``python/gpu_check.py`` is only the command
line). The rest, one job a module:

* ``gpu_manifest``   the bundle directory both halves share: manifest format, entry selection
* ``gpu_bundles``    ``build``: schedule, lower and write the bundles (TVM, tvm_roller, nvcc)
* ``gpu_launch``     load a bundle's module (NVRTC or cubin) and launch it with CuPy
* ``gpu_reference``  the PyTorch ops (float64 reference, float32/fp16 peer), inputs, errors
* ``gpu_timing``     timing with CUDA events, input copies to rotate
* ``gpu_micro``      the measured device constants
* ``gpu_measure``    per workload: compile ahead, check and time every implementation
* ``gpu_report``     the tables and their summary

On the GPU machine ``python/gpu_check.py`` imports this module without running
``tvm_roller/__init__.py`` (which imports TVM), so nothing at module level here, in the modules
above, nor in ``python/harness/cuda_check/__init__.py``, may import TVM or the rest of
tvm_roller: the build half (``gpu_bundles``) imports them inside its functions.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from harness.cuda_check.gpu_bundles import build
from harness.cuda_check.gpu_manifest import load_manifest, select
from harness.cuda_check.gpu_measure import check_workloads
from harness.cuda_check.gpu_micro import micro_benchmarks
from harness.cuda_check.gpu_report import table


def run(d: Path, ops: Optional[str] = None, budget_s: float = 420.0, micro: bool = True,
        per_impl_s: float = 0.25, out_dir: Optional[str] = None,
        log: Callable[[str], None] = print) -> Dict[str, Any]:
    """The run half on the GPU machine (see above): the device constants, every selected
    workload checked and timed, the tables; the result as written to ``$OUT/gpu_check.json``."""
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
        rows = check_workloads(wls, d, cp, l2, per_impl_s, t_start + budget_s, log)
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
