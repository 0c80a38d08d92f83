"""Compile a PyTorch model through Relax with roller, check it against PyTorch and time both.

What ``tvm-roller compile-model`` runs; also usable from Python::

    result = compile_model(torch_module, (1, 128, 768))
    print(format_result(result))
"""
from __future__ import annotations

import importlib
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from tvm_roller.core.errors import UnsupportedError
from tvm_roller.integrations.pytorch import import_torch


@dataclass
class ModelResult:
    """Everything compile-model measured for one model (plain data: prints and serialises)."""

    name: str
    input_shape: List[int]
    target: str
    compile_s: float
    cached: bool
    max_abs_err: float
    roller_ms: float
    torch_ms: float
    tvm_default_ms: Optional[float] = None
    tvm_default_compile_s: Optional[float] = None
    report: List[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def load_factory(spec: str) -> Tuple[Callable, str, str]:
    """``MODULE:FACTORY`` -> (factory, module name, factory name); ValueError when malformed."""
    if spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"expected MODULE:FACTORY (e.g. harness.examples.models:mlp), got {spec!r}")
    mod_name, fn_name = spec.split(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as err:
        raise ValueError(f"cannot import {mod_name!r}: {err}") from err
    factory = getattr(module, fn_name, None)
    if not callable(factory):
        raise ValueError(f"{mod_name} has no callable {fn_name!r}")
    return factory, mod_name, fn_name


def default_input_shape(mod_name: str, fn_name: str) -> Optional[Tuple[int, ...]]:
    """A module may declare ``INPUT_SHAPES = {factory_name: shape}`` (the examples do)."""
    shapes = getattr(importlib.import_module(mod_name), "INPUT_SHAPES", {})
    return tuple(shapes[fn_name]) if fn_name in shapes else None


def load_model(spec: str, input_shape: Optional[str] = None, batch: int = 1):
    """``(module, example input)`` of a model spec: ``hf:NAME`` (an architecture of
    :mod:`tvm_roller.tools.models.hf_archs`, random weights) or ``MODULE:FACTORY`` (its input
    shape from ``input_shape`` "1,128,768" or the module's ``INPUT_SHAPES``). ValueError when
    the spec or the shape is malformed."""
    import torch

    if spec.startswith("hf:"):
        from tvm_roller.tools.models import hf_archs

        name = spec[3:]
        if name not in hf_archs.ARCHS:
            raise ValueError(f"unknown architecture {name!r}; known: {', '.join(hf_archs.ARCHS)}")
        return hf_archs.build(name, batch)
    factory, mod_name, fn_name = load_factory(spec)
    if input_shape:
        try:
            shape = tuple(int(s) for s in input_shape.split(","))
        except ValueError:
            raise ValueError(f"--input-shape must be comma-separated integers, got "
                             f"{input_shape!r}") from None
    else:
        shape = default_input_shape(mod_name, fn_name)
        if shape is None:
            raise ValueError(f"{spec} declares no INPUT_SHAPES entry: pass --input-shape")
    torch.manual_seed(0)
    return factory(), torch.randn(*shape)


def _time_torch(model, x, min_s: float = 1.0) -> float:
    import torch

    with torch.no_grad():
        for _ in range(3):
            model(x)
        times: List[float] = []
        start = time.perf_counter()
        while time.perf_counter() - start < min_s or len(times) < 5:
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _time_vm(ex, arg, min_s: float = 1.0) -> Tuple[float, np.ndarray]:
    import tvm
    from tvm import relax

    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](arg)
    out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
    res = vm.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=int(min_s * 200))(arg)
    return float(res.median), out


def compile_model(model, input_shape: Sequence[int], target=None, name: str = "model",
                  cache: bool = True, tvm_default: bool = True, seed: int = 0,
                  min_time_s: float = 1.0, example=None, verify: bool = False) -> ModelResult:
    """Import ``model`` (an ``nn.Module``), compile it with roller, run it on random input (or
    on ``example``: token ids, ...) and compare with PyTorch; optionally also build and time
    TVM's default (unscheduled) build. ``verify``: the wrong-result guard for every function
    (``tvm_roller.relax.compile(verify=True)``)."""
    import torch
    import tvm

    from tvm_roller.integrations import relax as roller_relax
    from tvm_roller.planner import Context

    ctx = Context.make(target if target is not None else "llvm")  # the target normalised once
    tgt = ctx.target
    torch.manual_seed(seed)
    x = example if example is not None else torch.randn(*[int(s) for s in input_shape])
    mod = import_torch(model, x)

    report: List[dict] = []
    t0 = time.perf_counter()
    ex = roller_relax.compile(mod, ctx, report, cache=cache, verify=verify)
    compile_s = time.perf_counter() - t0
    cached = bool(report) and all(r.get("cached") for r in report)

    arg = tvm.runtime.tensor(x.numpy())
    roller_s, out = _time_vm(ex, arg, min_time_s)
    with torch.no_grad():
        ref = model(x).numpy()
    if out.shape != ref.shape:
        raise UnsupportedError(f"output shape {out.shape} differs from PyTorch's {ref.shape}")
    result = ModelResult(name, list(input_shape), str(tgt), compile_s, cached,
                         float(np.abs(out - ref).max()), roller_s * 1e3,
                         _time_torch(model, x, min_time_s) * 1e3, report=report)
    if tvm_default:
        t0 = time.perf_counter()
        ex_default = tvm.compile(mod, target=tgt)
        result.tvm_default_compile_s = time.perf_counter() - t0
        result.tvm_default_ms = _time_vm(ex_default, arg, min_time_s * 0.2)[0] * 1e3
    return result


def format_result(r: ModelResult) -> str:
    lines = [f"model {r.name}, input {tuple(r.input_shape)}, target {r.target}",
             f"compile: {r.compile_s:.2f} s ({'cached' if r.cached else 'cold'})",
             f"max abs error vs PyTorch: {r.max_abs_err:.3g}",
             f"latency: roller {r.roller_ms:.3f} ms | PyTorch {r.torch_ms:.3f} ms "
             f"(roller is {r.torch_ms / r.roller_ms:.2f}x PyTorch's speed)"]
    if r.tvm_default_ms is not None:
        lines.append(f"          TVM default {r.tvm_default_ms:.3f} ms "
                     f"(roller {r.tvm_default_ms / r.roller_ms:.1f}x faster; built in "
                     f"{r.tvm_default_compile_s:.1f} s)")
    n_roller = sum(e["status"] == "roller" for e in r.report)
    lines.append(f"PrimFuncs: {len(r.report)}, roller {n_roller}, fallback {len(r.report) - n_roller}")
    lines.append(f"  {'function':<58} {'by':<9} {'class':<12} {'predicted':>10}  reason")
    for e in r.report:
        pred = f"{e['predicted_s'] * 1e6:.1f} us" if e.get("predicted_s") else "-"
        lines.append(f"  {e['name'][:58]:<58} {e['status']:<9} {e.get('kind') or '-':<12} "
                     f"{pred:>10}  {e.get('reason', '')[:80]}")
    return "\n".join(lines)
