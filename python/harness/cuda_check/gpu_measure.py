"""Checking each workload on the GPU (``gpu_check``'s run half): compile every bundle's module
ahead, then per workload random inputs, each implementation's kernels launched with CuPy and
PyTorch's version, each checked against the float64 reference and timed.

Nothing here may import TVM or the rest of tvm_roller: the GPU machine has neither.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

# DEVICE is read through the module at each call: the tests set it to "cpu"
from harness.cuda_check import gpu_reference
from harness.cuda_check.gpu_launch import Launcher, load_module
from harness.cuda_check.gpu_manifest import ARCH, impls_of, read_gz
from harness.cuda_check.gpu_reference import random_tensor, rel_error, torch_op
from harness.cuda_check.gpu_report import fmt_us, status_text
from harness.cuda_check.gpu_timing import n_copies, time_calls


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


def _row_info(wl: Dict[str, Any]) -> Dict[str, Any]:
    """What a result row repeats from its manifest entry beyond the name."""
    info: Dict[str, Any] = {"kind": wl.get("kind", "suite"), "impls": impls_of(wl)}
    if "fusion" in wl:
        info["fusion"] = {k: wl["fusion"][k] for k in ("fuse", "reason")}
    return info


@dataclass
class _Case:
    """One workload's tensors on the device, shared by the checks of its implementations."""
    sets: List[List[Any]]  # the inputs, then copies of them to rotate among while timing
    outs: List[Any]  # an output tensor per set, pre-filled with NaN
    out_dtype: str
    ref: Any  # the float64 reference output
    tol: float


def _new_case(wl: Dict[str, Any], l2_bytes: int) -> _Case:
    """Random inputs (seed 0), the reference computed from them, and enough copies of both
    inputs and outputs to cover the L2."""
    import torch

    gen = torch.Generator(device=gpu_reference.DEVICE)
    gen.manual_seed(0)
    (out_shape, out_dtype), in_specs = wl["args"][-1], wl["args"][:-1]
    inputs = [random_tensor(s, dt, gen) for s, dt in in_specs]
    fn64, back64 = torch_op(wl["cls"], wl["params"], [x.to(torch.float64) for x in inputs])
    ref = back64(fn64())
    set_bytes = wl["bytes"]
    copies = n_copies(set_bytes, l2_bytes)
    sets = [inputs] + [[x.clone() for x in inputs] for _ in range(copies - 1)]
    outs = [torch.full(tuple(out_shape), float("nan"), device=gpu_reference.DEVICE,
                       dtype=getattr(torch, out_dtype))
            for _ in range(copies)]
    return _Case(sets, outs, out_dtype, ref, float(wl["tol"]))


def _check_impl(wl: Dict[str, Any], impl: str, case: _Case, d: Path, cp: Any,
                loaded: Dict[Tuple[str, str], Any], budget_s: float) -> Dict[str, Any]:
    """One implementation's result: not built (declined, build-error), or its kernels launched
    on the first set, checked against the reference and timed over all sets."""
    import torch

    info = wl.get(impl, {})
    res: Dict[str, Any] = {}
    if "bundle" not in info:
        res["status"] = "declined" if "declined" in info else "build-error"
        res["reason"] = info.get("declined") or info.get("error", "not built")
        return res
    sets, outs, copies = case.sets, case.outs, len(case.sets)
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
        res["rel_err"] = rel_error(outs[0], case.ref)
        res["status"] = "ok" if res["rel_err"] <= case.tol else "wrong"
        res.update(time_calls(lambda k: launcher.launch(prepared[k % copies]), budget_s))
    except Exception as err:  # noqa: BLE001
        res["status"] = "run-error"
        res["reason"] = f"{type(err).__name__}: {err}"[:500]
        torch.cuda.synchronize()
    return res


def _check_torch(wl: Dict[str, Any], case: _Case, budget_s: float) -> Dict[str, Any]:
    """PyTorch's result (the peer: float32, fp16 for the fp16 GEMMs), checked and timed the
    same way."""
    import torch

    res: Dict[str, Any] = {}
    sets, copies = case.sets, len(case.sets)
    try:
        dt = getattr(torch, case.out_dtype) if wl["kind"] == "hgemm" else torch.float32
        peers = [torch_op(wl["cls"], wl["params"], [x.to(dt) for x in s]) for s in sets]
        res["rel_err"] = rel_error(peers[0][1](peers[0][0]()), case.ref)
        res["status"] = "ok" if res["rel_err"] <= case.tol else "wrong"
        res.update(time_calls(lambda k: peers[k % copies][0](), budget_s))
    except Exception as err:  # noqa: BLE001
        res["status"] = "run-error"
        res["reason"] = f"{type(err).__name__}: {err}"[:500]
    return res


def check_workload(wl: Dict[str, Any], d: Path, cp: Any, l2_bytes: int,
                   budget_s: float = 0.25,
                   loaded: Optional[Dict[Tuple[str, str], Any]] = None) -> Dict[str, Any]:
    """Correctness and time of each implementation of one workload (roller's and dlight's, or a
    chain's roller and unfused) and of PyTorch's version."""
    loaded = loaded if loaded is not None else {}
    row: Dict[str, Any] = {"name": wl["name"], "flops": wl["flops"], "bytes": wl["bytes"],
                           **_row_info(wl)}
    case = _new_case(wl, l2_bytes)
    row["copies"] = len(case.sets)
    for impl in impls_of(wl):
        row[impl] = _check_impl(wl, impl, case, d, cp, loaded, budget_s)
    row["torch"] = _check_torch(wl, case, budget_s)
    return row


def check_workloads(wls: List[Dict[str, Any]], d: Path, cp: Any, l2: int, per_impl_s: float,
                    deadline: float, log: Callable[[str], None]) -> List[Dict[str, Any]]:
    """``check_workload`` for each of ``wls``, modules compiled ahead (``load_all``); those not
    started by ``deadline`` are reported as skipped."""
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
            f"{k}={status_text(row.get(k, {}))}/{fmt_us(row.get(k, {}).get('us'))}us"
            for k in impls_of(wl) + ["torch"]) + f"  ({row['wall_s']} s)")
        torch.cuda.empty_cache()
        cp.get_default_memory_pool().free_all_blocks()
    return rows
