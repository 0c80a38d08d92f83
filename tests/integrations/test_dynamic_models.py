"""Models exported once with a dynamic sequence length (``torch.export`` ``Dim``), compiled
once by ``tvm_roller.relax.compile``, run at many lengths against PyTorch: every symbolic
function roller schedules gets bucket kernels, and every one it leaves to TVM is a decline
with a reason (never an error). On CUDA the bucket kernels are declined (dlight builds)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, te

import tvm_roller
import tvm_roller.relax as rr
from tvm_roller.integrations.pytorch import import_torch
from tvm_roller.integrations.relax.passes.shape_bounds import bound_shapes_pass
from tvm_roller.integrations.relax.passes.workarounds import workarounds_pass

from conftest import TARGET as PINNED_TARGET, cuda_target, device

pytest.importorskip("transformers")
from harness.examples import hf_models  # noqa: E402  (needs transformers)

# pinned (the preset model): the buckets planned are the same on every host
TARGET = tvm_roller.hardware.normalize_target(PINNED_TARGET)


def _compile(model, ids, longest: int, **kw):
    seq = torch.export.Dim("seq", min=1, max=longest)
    mod = import_torch(model, ids, {1: seq})
    report = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tvm_roller.FallbackWarning)
        ex = rr.compile(mod, TARGET, report, device(), **kw)
    return relax.VirtualMachine(ex, tvm.cpu()), report


def _check_lengths(vm, model, vocab: int, lengths):
    for n in lengths:
        x = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))
        out = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
        with torch.no_grad():
            ref = model.double()(x).numpy()
        model.float()
        assert out.shape == ref.shape, n
        assert np.abs(out - ref).max() / np.abs(ref).max() <= 1e-4, n


def _check_report(report, at_least: int):
    errors = [e for e in report if e["fallback"] == "error"]
    assert not errors, [(e["name"], e["reason"]) for e in errors]
    left = [e for e in report if e["status"] == "fallback"]
    assert all(e["fallback"] == "decline" and e["reason"] for e in left)
    bucketed = [e for e in report if e.get("buckets")]
    assert len(bucketed) >= at_least, (len(bucketed), len(report))
    # the last bucket's kernel takes every larger value
    assert all(">=" in e["buckets"][-1]["values"] or len(e["buckets"]) == 1 for e in bucketed)
    return bucketed


def test_llama_one_compile_serves_every_length():
    """The Llama-style decoder of the issue (hidden 768, 2 layers: RMSNorm, rotary, SiLU-gated
    MLP, causal mask), lengths 1..512 from one compile."""
    model, ids = hf_models.llama("small", 32)
    vm, report = _compile(model, ids, 512, cache=False)
    # (the attention is one flash-attention kernel for every length, not bucketed; reshapes
    # are views and residual sums run in their matmuls: no kernels of their own)
    assert any(e["kind"] == "flash-attention" for e in report)
    bucketed = _check_report(report, at_least=20)
    matmuls = [e for e in bucketed if e["name"].startswith("matmul")]
    assert matmuls and all(len(e["buckets"]) > 1 for e in matmuls)
    _check_lengths(vm, model, 1000, (1, 7, 32, 128))


def test_gpt2_small_dynamic_and_module_cache_hit():
    model, ids = hf_models.gpt2("small", 16)
    vm, report = _compile(model, ids, 256)
    _check_report(report, at_least=20)
    _check_lengths(vm, model, 1000, (1, 5, 100, 256))
    # a second compile of the same model is a load, its report still lists the buckets
    _, again = _compile(model, ids, 256)
    assert again and all(e["cached"] for e in again)
    assert sum(bool(e.get("buckets")) for e in again) == sum(bool(e.get("buckets"))
                                                             for e in report)


def test_bounds_simplify_relax_shapes():
    """``x[:, :1]`` of a (1, n) tensor is (1, min(1, n)) to Relax; with n >= 1 it is (1, 1)."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((1, n), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], {"tir_var_lower_bound": {"n": 1},
                                   "tir_var_upper_bound": {"n": 64}}):
        with bb.dataflow():
            first = bb.emit(relax.op.strided_slice(x, [1], [0], [1]))
            both = bb.emit(relax.op.concat([first, x], axis=-1))
            out = bb.emit_output(relax.op.strided_slice(both, [-1], [1], [n + 1]))
        bb.emit_func_output(out)
    mod = bound_shapes_pass()(bb.get())
    text = mod["main"].script()
    assert "R.match_cast" in text and "min(" not in text.split("R.match_cast")[-1]
    with TARGET:
        with pytest.raises(tvm.error.InternalError, match="axis < src_tensor_dim"):
            relax.transform.LegalizeOps()(mod)  # TVM 0.27: a negative axis, symbolic bounds
        relax.transform.LegalizeOps()(workarounds_pass()(mod))  # axes from the front: fine


def test_cuda_declines_bucket_kernels_to_dlight():
    n = te.var("n", "int64")
    k64, m64 = tvm.tirx.IntImm("int64", 64), tvm.tirx.IntImm("int64", 32)
    A = te.placeholder((n, k64), "float32", "A")
    B = te.placeholder((k64, m64), "float32", "B")
    r = te.reduce_axis((tvm.tirx.IntImm("int64", 0), k64), "r")
    C = te.compute((n, m64), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    f = te.create_prim_func([A, B, C])
    with pytest.warns(tvm_roller.FallbackWarning, match="builds no bucket kernels"):
        tvm_roller.build(f, cuda_target("sm_90"), fallback=True)
