"""HuggingFace architectures (small configs, random weights, nothing downloaded) through
``tvm_roller.relax.compile`` with the default settings (chain fusion on): each matches PyTorch
and no PrimFunc hits a roller error; a failure injected into one function's scheduling is
reported as an error and the model still compiles and matches."""
from __future__ import annotations

import warnings

import pytest
import torch
import tvm
from tvm import relax

import tvm_roller
import tvm_roller.relax as rr
from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.planner import Context, schedule_function
from tvm_roller.planner import scheduling as planner_scheduling
from tvm_roller.integrations.pytorch import import_torch

from conftest import TARGET as PINNED_TARGET, device, rel_err

pytest.importorskip("transformers")
from harness.examples import hf_models  # noqa: E402  (needs transformers)

# pinned (the preset model): the share of roller kernels is the same on every host
TARGET = tvm_roller.hardware.normalize_target(PINNED_TARGET)


def _compile_and_run(model, x, chains=None, **kw):
    """The model's output by roller, its float64 PyTorch reference and the report
    (``chains``: a list that gets the matmul chains' and attentions' decisions)."""
    mod = import_torch(model, x)
    report = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tvm_roller.FallbackWarning)
        ex = rr.compile(mod, TARGET, report, device(), cache=False,
                        chains=[] if chains is None else chains, **kw)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()))
    out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
    hf_models.eager_experts(model)
    with torch.no_grad():
        ref = model.double()(x.double() if x.is_floating_point() else x).numpy()
    model.float()
    return out, ref, report


@pytest.mark.parametrize("name", sorted(hf_models.MODELS))
def test_hf_model_matches_pytorch(name):
    model, x = hf_models.MODELS[name]("small")
    out, ref, report = _compile_and_run(model, x)
    assert rel_err(out, ref) <= 1e-4
    errors = [e for e in report if e["fallback"] == "error"]
    assert not errors, errors
    # everything but what roller declines with a reason is scheduled by roller
    assert sum(e["status"] == "roller" for e in report) >= 0.8 * len(report)
    assert all(e["reason"] for e in report if e["status"] == "fallback")


def test_hf_convolutions_converted_to_channels_last():
    """The CPU pipeline runs PyTorch's NCHW / NCW convolutions as NHWC / NWC kernels."""
    model, x = hf_models.MODELS["resnet"]("small")
    with TARGET:
        fused = rr.fusion_passes()(import_torch(model, x))
    convs = [gv.name_hint for gv, f in fused.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and "conv" in gv.name_hint]
    assert convs and all("nhwc" in _block_names(fused[c]) for c in convs), convs
    kept = rr.fusion_passes(conv_layouts={})(import_torch(model, x))
    assert any("nchw" in _block_names(f) for _, f in kept.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc))


def _block_names(func) -> str:
    names = []
    post_order_visit(
        func.body, lambda n: names.append(n.name_hint) if isinstance(n, tvm.s_tir.SBlock) else None)
    return " ".join(names)


def _inject(monkeypatch, when):
    """Make roller's scheduling of the functions ``when(func)`` selects raise a plain error."""
    real = planner_scheduling.plan_and_lower
    hit = []

    def failing(func, *args):
        if when(func):
            hit.append(func)
            raise RuntimeError("injected failure")
        return real(func, *args)

    monkeypatch.setattr(planner_scheduling, "plan_and_lower", failing)
    return hit


def _reductions(func) -> int:
    count = []
    post_order_visit(
        func.body, lambda n: count.append(1) if isinstance(n, tvm.s_tir.SBlock) and any(
            int(iv.iter_type) == 2 for iv in n.iter_vars) else None)
    return len(count)


def test_injected_failure_falls_back_and_is_reported(monkeypatch):
    model, x = hf_models.MODELS["bert"]("small")
    # the matmuls outside the fused chains (the QKV projection with its bias)
    hit = _inject(monkeypatch, lambda f: _reductions(f) == 1 and len(f.params) >= 3)
    out, ref, report = _compile_and_run(model, x)
    assert hit
    assert rel_err(out, ref) <= 1e-4
    errors = [e for e in report if e["fallback"] == "error"]
    assert errors and all(e["status"] == "fallback" for e in errors)
    assert all("RuntimeError: injected failure" in e["reason"] for e in errors)
    assert any(e["status"] == "roller" for e in report)


def test_failing_multi_operator_function_is_built_as_its_operators(monkeypatch):
    """A function with two matmuls roller fails on as a whole (e.g. a chain group) is
    un-grouped: its operators are scheduled one by one, not dropped to TVM's default."""
    from conftest import chain_inputs, chain_reference
    from harness.bench.chains import gemm_chain

    func = gemm_chain([3], 37, 16, 29, 24, "softmax")
    hit = _inject(monkeypatch, lambda f: _reductions(f) >= 3)
    res = schedule_function(func, Context.make(TARGET, device()), "chain")
    new, entry = res.kernel, res.entry
    assert hit and new is not None
    assert entry.status == "roller" and entry.kind == "operators"
    assert entry.fallback == "error" and "injected failure" in entry.reason
    lib = tvm.compile(tvm.IRModule({"main": new.with_attr("global_symbol", "main")}), TARGET)
    a, b, d = chain_inputs([3], 37, 16, 29, 24)
    out = tvm.runtime.empty((3, 37, 24), "float32", tvm.cpu())
    lib["main"](*[tvm.runtime.tensor(v) for v in (a, b, d)], out)
    assert rel_err(out.numpy(), chain_reference(a, b, d, "softmax")) <= 1e-5


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit", "whisper_encoder"])
def test_attention_runs_as_flash_kernels(name):
    """Each layer's attention (under a padding mask, a causal mask, none) is a flash-attention
    kernel with its tiles and roofline bound, and the model still matches PyTorch."""
    model, x = hf_models.MODELS[name]("small")
    chains = []
    out, ref, report = _compile_and_run(model, x, chains=chains)
    assert rel_err(out, ref) <= 1e-4
    flash = [c for c in chains if c["reason"] == "flash attention kernel"]
    assert len(flash) == 2, chains  # the 2 layers'
    kernels = [e for e in report if e["kind"] == "flash-attention"]
    assert kernels and all(e["bound_s"] > 0 and e["rtile"]["lanes"] == 16 for e in kernels)
