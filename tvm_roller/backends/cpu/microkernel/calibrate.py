"""Measure each micro-kernel route the target has and this host can run: one core's rate per
register block, operands in L1 (a chunk of ``_KC`` reduction elements per call, the same A and B
panels every call), into ``CpuTraits.route_gops`` — ROLLER's per-device compute-rate table, one
row per instruction route. Routes the host cannot execute keep their presets (labelled so in
``explain``). Cached beside the device's calibration."""
from __future__ import annotations

import json
import warnings
from dataclasses import replace
from typing import Dict, List, Tuple

import numpy as np
import tvm
from tvm import tirx
from tvm.script import tirx as T

from tvm_roller.backends.cpu.microkernel.family import ROUTES
from tvm_roller.backends.cpu.microkernel.route import Operands, Route, Shape
from tvm_roller.cache.files import atomic_write
from tvm_roller.core.ffi import plain
from tvm_roller.hardware import calibration_store
from tvm_roller.hardware.cpu import from_target, host_cpu, host_runs, target_mattr
from tvm_roller.hardware.model import DeviceModel

_KC = 128  # reduction elements per call (or 4 of an A panel's rows): panels stay in L1
_FLOPS_PER_RUN = 2e8  # multiply-adds × 2 per timed run (~1 ms at a few hundred GOP/s)
_FORMAT = 2  # 2: A read row by row, block-wide B panels (the kernels changed)


def _kernel(route: Route, ops: Operands, shape: Shape) -> Tuple[tirx.PrimFunc, float, list]:
    """A function calling the micro-kernel ``reps`` times on the same panels; its flops and
    its arguments' (size, dtype)."""
    eb, kc = ops.elem_bytes, max(_KC, 4 * shape.a_k)
    a_bytes, b_bytes = shape.rows * kc * eb, shape.cols * kc * eb
    steps, flops = kc // shape.a_k, 2.0 * shape.rows * shape.cols * kc
    reps = max(1, int(_FLOPS_PER_RUN // flops))
    sym, acc = route.symbol(ops, shape), ops.acc
    lda, ldb = shape.a_rows * kc * eb, shape.b_cols * kc * eb
    ldc = shape.cols * 4

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((a_bytes,), "int8"), b: T.Buffer((b_bytes,), "int8"),
             c: T.Buffer((shape.rows * shape.cols,), acc)):
        for i in range(reps):
            T.evaluate(T.call_extern("void", sym, c.access_ptr("rw"), T.int64(ldc),
                                     a.access_ptr("r"), T.int64(lda), b.access_ptr("r"),
                                     T.int64(ldb), T.int64(steps)))

    func = main.with_attr("global_symbol", "main")
    body = tirx.AttrStmt(tvm.runtime.convert(0), "pragma_import_llvm",
                         tvm.runtime.convert(route.kernel_ir(ops, shape)), func.body)
    args = [(a_bytes, "int8"), (b_bytes, "int8"), (shape.rows * shape.cols, acc)]
    return func.with_body(body), flops * reps, args


def _time_one(target: tvm.target.Target, route: Route, ops: Operands, shape: Shape) -> float:
    func, flops, specs = _kernel(route, ops, shape)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.ones(size, dtype), dev) for size, dtype in specs]
    timer = lib.mod.time_evaluator("main", dev, number=1, repeat=15, min_repeat_ms=1)
    return flops / float(min(timer(*args).results)) / 1e9


def _measurable(dev: DeviceModel, host: DeviceModel) -> List[Tuple[Route, Operands, Shape]]:
    out = []
    for route in ROUTES:
        ops = next((o for o in route.operands if route.usable(dev, o) and route.usable(host, o)),
                   None)
        if ops is not None:
            out += [(route, ops, shape) for shape in route.shapes(dev, ops)]
    return out


def measure_routes(target: tvm.target.Target, dev: DeviceModel,
                   host: DeviceModel) -> Dict[str, float]:
    """``route_gops`` for ``dev`` (planned for ``target``): the routes ``host`` can run."""
    rates: Dict[str, float] = {}
    for route, ops, shape in _measurable(dev, host):
        try:
            rates[route.key(shape)] = round(_time_one(target, route, ops, shape), 2)
        except (RuntimeError, ValueError) as err:  # a route that fails here keeps its preset
            warnings.warn(f"measuring route {route.key(shape)} failed ({err}); its preset rate "
                          "is used", stacklevel=2)
    return rates


def with_route_rates(target: tvm.target.Target, dev: DeviceModel, measure: bool,
                     again: bool = False) -> DeviceModel:
    """``dev`` with its routes' measured rates: cached beside the target's calibration,
    measured here (and cached) when ``measure``, nothing is cached (or ``again``) and this host
    runs the target's code (``host_runs``); otherwise the presets."""
    spec = plain(target.export())
    key = calibration_store.calibration_key(host_cpu(), str(spec.get("mcpu") or "generic"),
                                            dev.num_units, target_mattr(spec))
    path = calibration_store.calibration_path(key + "__routes")
    rates = None
    if path.is_file() and not again:
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
            if payload.get("format") == _FORMAT:
                rates = {str(k): float(v) for k, v in payload["route_gops"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            rates = None  # unreadable: measured again (or presets)
    # (a target with instructions this host lacks would die of an illegal instruction)
    if rates is None and measure and host_runs(target):
        host = from_target(tvm.target.Target({"kind": "llvm", "mcpu": host_cpu()}),
                           use_cache=False)
        rates = measure_routes(target, dev, host)
        atomic_write(path, json.dumps({"format": _FORMAT, "route_gops": rates}, indent=1,
                                      sort_keys=True).encode("utf-8"))
    if not rates:
        return dev
    return replace(dev, cpu=replace(dev.cpu, route_gops=rates))
