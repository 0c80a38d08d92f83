"""The planner's data: frozen plans and chain decisions, lowering that changes no tile, one rule
per function picked by the backend, a cache hit through the same planner."""
from __future__ import annotations

import dataclasses

import pytest
from tvm import te, topi

import tvm_roller
from tvm_roller.planner import lower, plan
from tvm_roller.backends.registry import backend_for
from tvm_roller.hardware import normalize_target
from harness.bench.chains import gemm_chain

from conftest import TARGET, device


def _matmul(m=48, k=40, n=36, b_transposed=False):
    """A . B, or A . B^T (no contiguous output vector on a CPU: streamed there, tiled on a GPU)."""
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((n, k) if b_transposed else (k, n), "float32", name="B")
    r = te.reduce_axis((0, k), "k")
    return te.create_prim_func([A, B, te.compute((m, n), lambda i, j: te.sum(
        A[i, r] * (B[j, r] if b_transposed else B[r, j]), axis=r), name="C")])


def _softmax(rows=7, cols=129):
    X = te.placeholder((rows, cols), "float32", name="X")
    return te.create_prim_func([X, topi.nn.softmax(X)])


def _conv():
    X = te.placeholder((1, 9, 11, 5), "float32", name="X")
    W = te.placeholder((3, 3, 5, 7), "float32", name="W")
    return te.create_prim_func([X, W, topi.nn.conv2d_nhwc(X, W, 1, 1, 1, out_dtype="float32")])


CASES = {"matmul": (_matmul, "tiled"), "matmul_nt": (lambda: _matmul(96, 40, 64, b_transposed=True), "streaming"),
         "softmax": (_softmax, "streaming"), "conv": (_conv, "conv")}
CUDA = "nvidia/nvidia-h100"


@pytest.mark.parametrize("name", list(CASES))
def test_each_function_gets_its_rule(name):
    make, rule = CASES[name]
    p = plan(make(), TARGET, topk=2, device=device())
    assert p.rule.name == rule and p.rule is backend_for(normalize_target(TARGET)).rule_for(p.analysis)
    assert all(t.kind == p.rule.tile_kind(p.analysis) for t in p.tiles)


@pytest.mark.parametrize("target", [TARGET, CUDA])
@pytest.mark.parametrize("name", list(CASES))
def test_plan_is_frozen_and_lowering_changes_no_tile(name, target):
    func = CASES[name][0]()
    kind = backend_for(normalize_target(target)).analyze(func).kind  # the analysis's own view of the function
    p = plan(func, target, topk=2, device=None if target == CUDA else device())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.tiles = ()
    before = [t.to_json() for t in p.tiles]
    for t in p.tiles:
        lower(p, t)
    assert [t.to_json() for t in p.tiles] == before
    assert p.analysis.kind == kind  # the GPU's view of a function is the rule's, not a relabel


@pytest.mark.parametrize("target", [TARGET, CUDA])
def test_chain_decision_is_frozen_and_explained(target):
    func = gemm_chain([2], 64, 32, 64, 32, middle="softmax")
    p = plan(func, target, device=None if target == CUDA else device())
    assert p.chain is not None and p.fusion is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.fusion.fuse = not p.fusion.fuse
    assert p.fusion.rows >= 1 and p.fusion.reason
    text = tvm_roller.explain(func, target, device=None if target == CUDA else device())
    assert "GEMM chain:" in text and p.fusion.reason in text
    assert lower(p, p.tiles[0]).fusion.fuse in (True, False)
