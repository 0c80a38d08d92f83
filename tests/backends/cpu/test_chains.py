"""GEMM chains (Chimera): detection, the fused and the unfused CPU kernels against float64 numpy."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvm_roller
from tvm_roller.backends.cpu import chain_lower
from tvm_roller.backends.cpu import chain_plan
from tvm_roller.backends.cpu.chain_plan import FUSE_MARGIN
from tvm_roller.fusion import split
from tvm_roller.fusion.chain import detect_chain
from harness.bench.chains import gemm_chain
from tvm_roller.tools.suite import workloads as W

from conftest import (CHAIN_CASES, TARGET, assert_close, chain_inputs, chain_reference,
                      conv_chain_reference, device, rand, run)


@pytest.mark.parametrize("batch,m,k,l,n,middle", CHAIN_CASES)
def test_fused_and_unfused_match_numpy(batch, m, k, l, n, middle):  # noqa: E741
    func = gemm_chain(batch, m, k, l, n, middle)
    chain = detect_chain(func)
    assert chain is not None and (chain.m, chain.k, chain.l, chain.n) == (m, k, l, n)
    arrays = chain_inputs(batch, m, k, l, n)
    ref = chain_reference(*arrays, middle)
    tgt = tvm_roller.hardware.normalize_target(TARGET)
    out_shape = tuple(batch or ()) + (m, n)
    divisors = [d for d in (1, 2, 3, 4, 8, 16, m) if m % d == 0]
    for apply in (chain_lower.apply_fused, chain_lower.apply_unfused):
        for rows in sorted({divisors[0], divisors[-1], divisors[len(divisors) // 2]}):
            lib = tvm.compile(apply(func, chain, rows, 16).mod, target=tgt)
            assert_close(run(lib, arrays, out_shape, "float32"), ref,
                         5e-5 if middle == "softmax" else 2e-5)
    # declined: the operators one by one, each with roller's schedule for it alone
    lib = tvm.compile(_operators_in_turn(func, chain).mod, target=tgt)
    assert_close(run(lib, arrays, out_shape, "float32"), ref, 5e-5 if middle == "softmax" else 2e-5)


def _operators_in_turn(func, chain):
    return split.build_unfused(func, chain,
                               lambda part: tvm_roller.schedule(part, TARGET, device=device()))


def test_split_keeps_operators_apart():
    """The declined build is three functions' kernels in one: the first matmul with nothing
    after it, softmax, the second matmul, the intermediates allocated between them."""
    func = gemm_chain([3], 37, 13, 41, 11, "softmax")
    chain = detect_chain(func)
    parts, between = split.split_chain(func, chain)
    assert [len(list(p.params)) for p in parts] == [3, 2, 3]
    assert [b.name for b in between] == ["C", "S"]
    p = tvm_roller.plan(func, TARGET, device=device())
    assert not p.fusion.fuse  # 3 x 37 x 41 scores fit any L2
    sch = tvm_roller.planner.apply(p, p.tiles[0])
    assert not sch.trace.insts  # IR of the stitched operators, not a trace
    assert tvm_roller.planner.apply(p, p.tiles[0], traceable=True).trace.insts


def test_detection_negative():
    for cls, idx in [("GMM", 1), ("SFM", 1), ("CBR", 1), ("C2D", 0), ("TBG", 0)]:
        assert detect_chain(W.create(cls, idx)) is None


def test_build_fuses_big_chain_and_explains():
    """The attention-like chain (intermediate 12 x 512 x 512 fp32 = 12 MiB) is fused by
    tvm_roller.build; explain shows the decision and the predicted volumes."""
    func = gemm_chain([12], 512, 64, 512, 64, "none")
    p = tvm_roller.plan(func, TARGET, device=device())
    assert p.chain is not None and p.fusion.fuse, p.fusion.reason
    text = tvm_roller.explain(func, TARGET, device=device())
    assert "GEMM chain" in text and "decision: fused" in text


def test_build_small_chain_correct_either_way():
    func = gemm_chain([2], 16, 8, 16, 8, "relu")
    p = tvm_roller.plan(func, TARGET, device=device())
    assert p.chain is not None
    lib = tvm_roller.build(func, TARGET, device=device())
    arrays = chain_inputs([2], 16, 8, 16, 8)
    assert_close(run(lib, arrays, (2, 16, 8), "float32"), chain_reference(*arrays, "relu"), 2e-5)


@pytest.mark.parametrize("seq", [128, 512])
def test_relax_bert_layer_chains(seq):
    """The Relax pipeline groups the BERT layer's two chains (attention: QK^T -> softmax/mask ->
    .V; MLP: up-projection -> GELU -> down-projection), decides for each, matches PyTorch."""
    import torch
    from tvm import relax

    from tvm_roller.integrations.pytorch import import_torch
    from harness.examples import models

    model = models.bert_layer()
    x = torch.randn(1, seq, 768)
    mod = import_torch(model, x)
    report, decisions = [], []
    tgt = tvm_roller.hardware.normalize_target(TARGET)
    ex = tvm_roller.relax.compile(mod, tgt, report, device=device(), cache=False,
                                  chains=decisions)
    assert len(decisions) == 2, decisions  # attention and MLP, each with the model's reason
    assert all("traffic" in d["reason"] and "predicted fused" in d["reason"] for d in decisions)
    fused = [d for d in decisions if d["fused"]]
    assert len([e for e in report if e.get("fusion")]) == len(fused)  # one PrimFunc per fused
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(out - ref).max() < 1e-4
    attention = next(d for d in decisions if f". {seq}x64" in d["chain"])
    # 12 x 512 x 512 scores do not fit the L2 caches: fusing saves their round trips through
    # memory (at 128 tokens the predicted times decide either way)
    if seq == 512:
        assert attention["fused"], attention


@pytest.mark.parametrize("shape", [(1, 9, 7, 5, 6, 3), (2, 5, 1, 3, 4, 1)])
def test_conv_chain_fused_and_unfused(shape):
    """3x3 conv (padding 1) -> ReLU -> 1x1 conv, NHWC, odd and size-1 shapes; both kernels."""
    from harness.bench.chains import conv_chain

    n, h, w, ci, cm, co = shape
    func = conv_chain(*shape)
    chain = detect_chain(func)
    assert chain is not None and chain.producers and chain.l == cm and chain.n == co
    x, w1 = rand((n, h, w, ci), seed=1), rand((3, 3, ci, cm), seed=2)
    w2 = rand((1, 1, cm, co), seed=3)
    ref = conv_chain_reference(x, w1, w2)
    tgt = tvm_roller.hardware.normalize_target(TARGET)
    for apply in (chain_lower.apply_fused, chain_lower.apply_unfused):
        for rows in sorted({1, w}):
            lib = tvm.compile(apply(func, chain, rows, 16).mod, target=tgt)
            assert_close(run(lib, [x, w1, w2], (n, h, w, co), "float32"), ref, 2e-5)
    lib = tvm.compile(_operators_in_turn(func, chain).mod, target=tgt)
    assert_close(run(lib, [x, w1, w2], (n, h, w, co), "float32"), ref, 2e-5)
    lib = tvm_roller.build(func, TARGET, device=device())  # whatever the model decides
    assert_close(run(lib, [x, w1, w2], (n, h, w, co), "float32"), ref, 2e-5)


def test_relax_repeated_layers_share_one_chain_function():
    """Two identical encoder layers whose attention chains are fused: TVM's BlockBuilder hands
    back the first layer's (structurally equal) chain function for the second; both layers
    call it, and the model matches PyTorch."""
    import torch
    from torch import nn
    from tvm import relax

    from tvm_roller.integrations.pytorch import import_torch

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(768, 12, 256, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(1, 512, 768)
    mod = import_torch(model, x)
    decisions = []
    tgt = tvm_roller.hardware.normalize_target(TARGET)
    with tgt:
        grouped = tvm_roller.relax.fusion_passes(device=device(), chains=decisions)(mod)
    fused = [d for d in decisions if d["fused"]]
    assert len(fused) == 2, decisions  # each layer's attention
    names = [gv.name_hint for gv, _ in grouped.functions_items() if "gemm_chain" in gv.name_hint]
    assert len(names) == 1, names
    report = []
    ex = tvm_roller.relax.compile(mod, tgt, report, device=device(), cache=False)
    assert not [e for e in report if e["fallback"] == "error"]
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(out - ref).max() < 1e-4


def test_relax_projection_into_scores_is_no_chain():
    """Q = X.Wq reshaped into heads then Q.K^T: the second matmul's rows are not the first's,
    so no chain is grouped there (it was planned as one matmul with a matmul epilogue)."""
    import torch
    from tvm import relax

    from tvm_roller.integrations.pytorch import import_torch
    from tvm_roller.integrations.relax.passes.chains import find_chains

    class Scores(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Linear(64, 64)

        def forward(self, x):
            q = self.q(x).reshape(1, 37, 4, 16).transpose(1, 2)
            k = x.reshape(1, 37, 4, 16).transpose(1, 2)
            return torch.matmul(q, k.transpose(-1, -2))

    mod = import_torch(Scores().eval(), torch.randn(1, 37, 64))
    block = mod["main"].body.blocks[0]
    assert find_chains(block) == []


TASK_TILE_CASES = CHAIN_CASES + [
    ([2], 96, 64, 160, 32, "none"),     # regular: the policy's tiles fit the task
    ([3], 53, 29, 67, 19, "softmax"),   # primes: columns padded, rows of a prime count
    (None, 48, 40, 200, 24, "relu"),    # 200 columns padded to the two vectors (208)
]


@pytest.mark.parametrize("batch,m,k,l,n,middle", TASK_TILE_CASES)
def test_fused_kernel_with_task_tiles_matches_numpy(batch, m, k, l, n, middle):  # noqa: E741
    """The fused kernel with the tiles the decision chose for its matmuls (roller's policy on
    one task's share of each) matches float64 numpy, whatever the shape."""
    func = gemm_chain(batch, m, k, l, n, middle)
    p = tvm_roller.plan(func, TARGET, device=device())
    times = p.fusion.prediction
    assert times is not None and len(times.tiles) == 2
    arrays = chain_inputs(batch, m, k, l, n)
    tgt = tvm_roller.hardware.normalize_target(TARGET)
    sch = chain_lower.apply_fused(func, p.chain, p.fusion.rows, 16, times.tiles)
    lib = tvm.compile(sch.mod, target=tgt)
    assert_close(run(lib, arrays, tuple(batch or ()) + (m, n), "float32"),
                 chain_reference(*arrays, middle), 5e-5 if middle == "softmax" else 2e-5)


def test_task_tiles_are_the_policys_and_fit():
    """For a regular chain the tiles fit the task exactly (no fallback to the default tile),
    take more than one register row and vector, and block the reduction for L1."""
    func = gemm_chain([12], 512, 64, 512, 64, "none")
    p = tvm_roller.plan(func, TARGET, device=device())
    lanes = device().simd_lanes("float32")
    first, second = p.fusion.prediction.tiles
    rows = p.fusion.rows
    assert first.fits(rows, 512, [64], lanes) and second.fits(rows, 64, [512], lanes)
    for t in (first, second):
        assert t.reg_rows * (t.reg_cols // lanes) >= 8  # enough accumulators to hide latency
        assert t.l1_rows > t.reg_rows or t.chunks[0] < 512


def test_decision_weighs_predicted_times():
    """The decision is read from predicted times of both versions, shown in explain with the
    constants' source; the fused side follows the calibrated micro-kernel table; the rule
    fuses only below the margin."""
    import dataclasses

    func = gemm_chain([12], 512, 64, 512, 64, "none")
    dev = device()
    p = tvm_roller.plan(func, TARGET, device=dev)
    t = p.fusion.prediction
    assert p.fusion.fuse and t.fused_s < FUSE_MARGIN * t.unfused_s
    assert "round trips" in t.unfused_terms and "in-core" in t.fused_terms
    text = tvm_roller.explain(func, TARGET, device=dev)
    assert "predicted fused" in text and "predicted unfused" in text and "constants:" in text
    # a chain whose intermediate fits the L2 caches: no round trips, nothing to win
    small = gemm_chain([2], 64, 64, 64, 64, "none")
    ps = tvm_roller.plan(small, TARGET, device=dev)
    assert "round trips" not in ps.fusion.prediction.unfused_terms
    # the fused side is predicted at the calibrated rate of its tasks' tiles: a measured table
    # where every tile of more than one accumulator runs at a quarter of the best rate makes
    # the fused tasks about 4x slower
    table = {f"{r}x{v}": 100.0 if r * v == 1 else 25.0 for r in (1, 2, 4, 8, 12, 14, 16)
             for v in (1, 2, 4)}
    slow = dataclasses.replace(dev, cpu=dataclasses.replace(dev.cpu, tile_gflops=table))
    tq = tvm_roller.plan(func, TARGET, device=slow).fusion.prediction
    assert tq.fused_terms["in-core"] > 2 * t.fused_terms["in-core"]
    # and the rule: fused only when its prediction is below FUSE_MARGIN x the unfused one
    for unfused_s, fuse in ((1.0, False), (1.0 / FUSE_MARGIN - 0.01, False),
                            (1.0 / FUSE_MARGIN + 0.01, True)):
        times = dataclasses.replace(t, fused_s=1.0, unfused_s=unfused_s)
        plan = dataclasses.replace(p.fusion.model)
        chain_plan.decide(plan, dev, p.chain.intermediate_bytes, times)
        assert plan.fuse == fuse and "predicted fused 1000.000 ms" in plan.reason


def test_chain_whose_operators_cannot_be_predicted_is_kept_apart(monkeypatch):
    """An operator roller cannot plan alone leaves nothing to compare: the chain is not fused,
    with the reason, and still builds correctly (no crash)."""
    from tvm_roller.backends.registry import backend_for
    from tvm_roller.core.errors import UnsupportedError

    rule = backend_for(tvm_roller.hardware.normalize_target(TARGET)).chain_rule

    def refuse(fa, dev):
        raise UnsupportedError("no rule for this operator (test)")

    monkeypatch.setattr(rule, "plan_alone", refuse)
    func = gemm_chain([2], 16, 8, 16, 8, "relu")
    p = tvm_roller.plan(func, TARGET, device=device())
    assert not p.fusion.fuse and "cannot be predicted alone" in p.fusion.reason
    assert p.fusion.prediction is None
    lib = tvm_roller.build(func, TARGET, device=device())
    arrays = chain_inputs([2], 16, 8, 16, 8)
    assert_close(run(lib, arrays, (2, 16, 8), "float32"), chain_reference(*arrays, "relu"), 2e-5)


def test_relax_chain_whose_plan_fails_is_kept_apart_and_reported(monkeypatch):
    """A defect in the chain decision (here an injected error) does not fail the model's
    compile: the chain's operators stay apart and the decision says it was an error."""
    import torch
    from tvm import relax

    from tvm_roller.backends.registry import backend_for
    from tvm_roller.integrations.pytorch import import_torch
    from harness.examples import models

    rule = backend_for(tvm_roller.hardware.normalize_target(TARGET)).chain_rule

    def broken(chain, dev, stage_kinds=None):
        raise RuntimeError("injected chain failure")

    monkeypatch.setattr(rule, "plan", broken)
    model = models.bert_layer()
    x = torch.randn(1, 64, 768)
    decisions = []
    ex = tvm_roller.relax.compile(import_torch(model, x), tvm_roller.hardware.normalize_target(
        TARGET), device=device(), cache=False, chains=decisions)
    assert decisions and all(not d["fused"] and d["reason"].startswith(
        "error: RuntimeError: injected chain failure") for d in decisions)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        assert np.abs(out - model(x).numpy()).max() < 1e-4


@pytest.mark.parametrize("l,wide", [(1500, 4), (1214, 2), (200, 8), (512, 16)])
def test_rows_of_partial_vectors_are_not_fused(l, wide):  # noqa: E741
    """The fused kernel's stages between the matmuls run at the row's vector width; a row that
    is not whole vectors (Whisper's 1,500, AST's 1,214) is left to the operators, which
    vectorize it whole (measured 0.82x and 0.34x fused)."""
    why = chain_lower.degenerate_tiles(detect_chain(gemm_chain([6], 64, 64, l, 64, "softmax")),
                                       rows=64, lanes=16)
    if wide < 16:
        assert f"rows of {l} give {wide}-wide vectors" in why, why
    else:
        assert "wide vectors" not in why, why


def test_relax_chain_over_views_of_a_two_dim_batch_stays_fused():
    """float64 attention over ``[3, 3, 32, 16]`` (no flash kernel: float64), each matmul between
    the rank-3 views torch.export imports: the fused chain's softmax partial max moves under a
    task loop fused from the batch's two axes, whose binding TVM's ``vectorize`` does not take
    as affine; the lanes then stay scalar, and the chain stays fused rather than failing (it was
    a ScheduleError, the chain built as its operators one by one and reported as an error)."""
    from tvm import relax

    b, h, s, d = 3, 3, 32, 16
    q, k, v = (relax.Var(n, relax.TensorType((b, h, s, d), "float64")) for n in "qkv")
    bb = relax.BlockBuilder()

    def matmul(x, y):  # as torch.export imports a rank-4 matmul
        xs, ys = ([int(t) for t in e.ty.shape] for e in (x, y))
        x3, y3 = (bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(e, es)), [b * h, *es[2:]]))
                  for e, es in ((x, xs), (y, ys)))
        return bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(x3, y3)), [b, h, xs[2], ys[3]]))

    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            scores = matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2])))
            out = bb.emit_output(matmul(bb.emit(relax.op.nn.softmax(scores, axis=-1)), v))
        bb.emit_func_output(out)
    report, decisions = [], []
    ex = tvm_roller.relax.compile(bb.get(), tvm_roller.hardware.normalize_target(TARGET), report,
                                  device=device(), cache=False, chains=decisions)
    assert [d["fused"] for d in decisions if not d["chain"].startswith("attention")] == [True]
    assert not [e for e in report if e["fallback"]], report
    arrays = [np.random.default_rng(i).uniform(-1, 1, (b, h, s, d)) for i in range(3)]
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*map(tvm.runtime.tensor, arrays)).numpy()
    scores = arrays[0] @ arrays[1].swapaxes(-1, -2)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    assert_close(got, p / p.sum(-1, keepdims=True) @ arrays[2], 1e-12)
