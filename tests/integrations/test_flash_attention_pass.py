"""The Relax pass that makes attentions flash-attention kernels: the forms models write
(a scale multiplied or divided, a mask added, heads folded into a rank-3 batch), each checked
against float64 PyTorch, and the forms it leaves to the matmul-chain fusion with the reason."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvm_roller.relax as rr
from conftest import TARGET, device, rel_err
from test_hf_models import _compile_and_run

HEADS, DIM = 3, 16
GQA_HEADS, KV_HEADS = 6, 2


class Attention(torch.nn.Module):
    """``x [1, s, HEADS * DIM]`` -> attention of its three projections, in one of the forms."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.qkv = torch.nn.Linear(HEADS * DIM, 3 * HEADS * DIM)

    def forward(self, x):
        s = x.shape[1]
        q, k, v = (t.reshape(1, s, HEADS, DIM).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        if self.form == "rank3":
            q, k, v = (t.reshape(HEADS, s, DIM) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2))
        if self.form == "divide":
            scores = scores / math.sqrt(DIM)
        else:
            scores = scores * (1.0 / math.sqrt(DIM))
        if self.form in ("mask", "divide"):
            mask = torch.zeros(1, 1, 1, s, dtype=x.dtype)
            mask[..., s - s // 3:] = torch.finfo(x.dtype).min  # the last third padded
            scores = scores + mask
        if self.form == "key_broadcast":
            scores = scores + torch.arange(s, dtype=x.dtype).reshape(1, 1, s, 1) / s
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return out.reshape(1, HEADS, s, DIM).transpose(1, 2).reshape(1, s, HEADS * DIM)


class GroupedAttention(torch.nn.Module):
    """Grouped-query attention as HF's eager Llama writes it: ``KV_HEADS`` heads of keys and
    values repeated for the ``GQA_HEADS`` query heads (``repeat_kv``), a causal mask."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(DIM, GQA_HEADS * DIM)
        self.kv = torch.nn.Linear(DIM, 2 * KV_HEADS * DIM)

    @staticmethod
    def repeat_kv(x):
        b, kvh, s, d = x.shape
        rep = GQA_HEADS // KV_HEADS
        return x[:, :, None, :, :].expand(b, kvh, rep, s, d).reshape(b, kvh * rep, s, d)

    def forward(self, x):
        s = x.shape[1]
        q = self.q(x).reshape(1, s, GQA_HEADS, DIM).transpose(1, 2)
        k, v = (t.reshape(1, s, KV_HEADS, DIM).transpose(1, 2) for t in self.kv(x).chunk(2, -1))
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        mask = torch.full((s, s), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None]
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(DIM) + mask
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return out.transpose(1, 2).reshape(1, s, GQA_HEADS * DIM)


@pytest.mark.parametrize("s", [1, 23])
def test_grouped_query_attention_reads_each_kv_head_once(s):
    """HF's ``repeat_kv`` form is one flash kernel over the unrepeated kv heads."""
    torch.manual_seed(1)
    chains = []
    out, ref, report = _compile_and_run(GroupedAttention().eval(), torch.randn(1, s, DIM),
                                        chains=chains)
    assert rel_err(out, ref) <= 1e-5
    assert [c["reason"] for c in chains] == ["flash attention kernel"], chains
    kernel = next(e for e in report if e["kind"] == "flash-attention")
    assert kernel["bound_s"] > 0


def _compile(form: str, s: int):
    torch.manual_seed(0)
    chains = []
    out, ref, report = _compile_and_run(Attention(form).eval(), torch.randn(1, s, HEADS * DIM),
                                        chains=chains)
    return out, ref, report, chains


@pytest.mark.parametrize("form", ["scale", "divide", "mask", "rank3"])
@pytest.mark.parametrize("s", [1, 37])
def test_forms_become_flash_kernels(form, s):
    out, ref, report, chains = _compile(form, s)
    assert rel_err(out, ref) <= 1e-5
    assert [c["reason"] for c in chains] == ["flash attention kernel"], chains
    kernel = next(e for e in report if e["kind"] == "flash-attention")
    assert kernel["bound_s"] > 0 and kernel["bound_by"]


def test_a_bias_along_the_queries_only_stays_a_chain_with_the_reason():
    out, ref, _, chains = _compile("key_broadcast", 29)
    assert rel_err(out, ref) <= 1e-5
    assert any("flash attention declined" in c["reason"] and "along the keys" in c["reason"]
               for c in chains), chains


def _relax_attention(dtype: str, s: int):
    """``softmax(q·kᵀ · 0.25) · v`` over ``[1, HEADS, s, DIM]`` operands, built in Relax."""
    q, k, v = (relax.Var(n, relax.TensorType((1, HEADS, s, DIM), dtype)) for n in "qkv")
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            scores = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
            scaled = bb.emit(relax.op.multiply(scores, relax.const(0.25, dtype)))
            out = bb.emit_output(relax.op.matmul(bb.emit(relax.op.nn.softmax(scaled)), v))
        bb.emit_func_output(out)
    return bb.get()


def test_float64_attention_stays_float64():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, HEADS, 23, DIM)) for _ in range(3))
    report, chains = [], []
    ex = rr.compile(_relax_attention("float64", 23), TARGET, report, device(), cache=False,
                    chains=chains)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a)
                                                        for a in (q, k, v)]).numpy()
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)
    assert got.dtype == np.float64 and np.abs(got - want).max() / np.abs(want).max() < 1e-12
    assert not any(e["kind"] == "flash-attention" for e in report)
    assert any("float32" in c["reason"] for c in chains), chains
