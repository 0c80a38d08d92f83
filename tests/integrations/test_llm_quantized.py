"""tvm_roller.llm with weights="int8" / "int4": every generated token checked against the
float64 forward of the same model with its weights replaced by their dequantized values (the
remaining difference is the activations' 8-bit quantization, so a token must be the reference's
argmax or within a small margin of it); weights of shapes a format cannot take stay float32 with
their reason; the float32 copies are not kept. On the AVX-512 VNNI target, and on an AVX2-only
one (Haswell: the vpmaddubsw route, int8 weights as signed bytes)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tvm.target import codegen

transformers = pytest.importorskip("transformers")

import tvm_roller.llm as llm  # noqa: E402
from tvm_roller.backends.cpu.quant_format import FORMATS, dequantize, quantize, \
    shape_reason  # noqa: E402
from tvm_roller.hardware import host_target  # noqa: E402

from conftest import VNNI_TARGET, device_for  # noqa: E402

AVX2_TARGET = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}


def _host_has(feature: str):
    return pytest.mark.skipif(not codegen.target_has_features(feature, host_target()),
                              reason=f"this CPU has no {feature}")


_MOE = {  # a mixture of experts: Mixtral-style (8 experts, top-2), Qwen-MoE-style (top-4 of
    # 8 small experts, renormalised, a gated shared expert)
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, sliding_window=None),
    "qwen2_moe": dict(num_experts=8, num_experts_per_tok=4, moe_intermediate_size=32,
                      shared_expert_intermediate_size=80, norm_topk_prob=True)}


def _model(family: str, vocab: int):
    cfg_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                          "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                          "mixtral": (transformers.MixtralConfig,
                                      transformers.MixtralForCausalLM),
                          "qwen2_moe": (transformers.Qwen2MoeConfig,
                                        transformers.Qwen2MoeForCausalLM)}[family]
    torch.manual_seed(7)
    extra = {"sliding_window": None, "tie_word_embeddings": True} if family == "qwen2" else {}
    extra.update(_MOE.get(family, {}))
    cfg = cfg_cls(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                  max_position_embeddings=128, **extra)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # larger weights: logits far from flat
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
    return model


def _dequantized(model, fmt: str):
    """A float64 copy whose every matrix the format takes holds its dequantized values, and
    every stacked expert ``[experts, n, k]`` too (HF's eager experts: grouped_mm takes no
    float64)."""
    from harness.examples.hf_models import eager_experts

    f = FORMATS[fmt]
    ref = eager_experts(copy.deepcopy(model).double())
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() in (2, 3) and shape_reason(f, *p.shape[-2:]) is None:
                w = p.detach().float().numpy().reshape(-1, *p.shape[-2:])
                back = np.stack([dequantize(f, *quantize(f, e)) for e in w])
                p.copy_(torch.from_numpy(back.reshape(p.shape)))
    return ref


def _check_tokens(lm, model, fmt: str, vocab: int, prompt: int, top_k: int = 0) -> None:
    """32 greedy tokens, each the dequantized float64 model's argmax or within its margin
    (a mixture of ``top_k`` experts: except where the reference's routing is a near tie, which
    the activations' rounding may flip)."""
    ids = torch.randint(0, vocab, (1, prompt), generator=torch.Generator().manual_seed(prompt))
    out = lm.generate(ids, 32)
    ref = _dequantized(model, fmt)
    with torch.no_grad():
        logits = ref(out).logits[0, prompt - 1:-1].numpy()
    chosen = logits[np.arange(len(logits)), out[0, prompt:].numpy()]
    gap = logits.max(-1) - chosen
    firm = _firm_routing(ref, out, top_k)[prompt - 1:-1] if top_k else np.ones(len(gap), bool)
    assert firm.mean() >= 0.6  # (the check is not vacuous)
    # the activations' 8-bit rounding moves a logit by well under 2% of the logits' spread
    # (3% through a mixture: its routing weights, a softmax of router logits the rounding
    # moves, carry it further)
    tolerance = 0.03 if top_k else 0.02
    assert (gap[firm] <= tolerance * logits.std()).all(), gap[firm].max() / logits.std()
    assert (gap == 0).mean() >= 0.9


def _firm_routing(ref, ids, top_k: int) -> np.ndarray:
    """Per position: whether every layer's router separates its top ``top_k`` experts from the
    rest by more than 2% of the router logits' spread."""
    gates: list = []
    hooks = [m.register_forward_hook(lambda mod, i, o: gates.append(o)) for name, m in
             ref.named_modules() if name.endswith("mlp.gate")]
    with torch.no_grad():
        ref(ids)
    for h in hooks:
        h.remove()
    firm = np.ones(ids.shape[1], bool)
    for g in gates:
        g = (g[0] if isinstance(g, tuple) else g).reshape(ids.shape[1], -1).numpy()
        top = -np.sort(-g, axis=-1)
        firm &= top[:, top_k - 1] - top[:, top_k] > 0.02 * g.std()
    return firm


@_host_has("avx512vnni")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("family,vocab,prompt", [("llama", 112, 5), ("qwen2", 97, 1),
                                                  ("qwen2", 128, 11)])
def test_quantized_tokens_follow_the_dequantized_float64_model(fmt, family, vocab, prompt):
    model = _model(family, vocab)
    # planned for the pinned VNNI target (run where the host has VNNI)
    lm = llm.compile(model, VNNI_TARGET, max_seq_len=48, weights=fmt,
                     device=device_for(VNNI_TARGET), cache=False)
    _check_tokens(lm, model, fmt, vocab, prompt)
    weights = [e for e in lm.report if e["kind"] == "quant-weight"]
    declined = [e for e in weights if e["status"] != "roller"]
    if vocab % 16:  # the embedding / LM head table: declined with its reason, kept float32
        assert declined and all("multiples of 16" in e["reason"] for e in declined)
    else:
        assert not declined
    assert any(e["kind"] == "quant-linear" for e in lm.report)
    # the packed weights replace the float32 ones: no float32 matrix is kept where one was
    # quantized
    kept = sum(w.numpy().nbytes for w in lm.decode_weights)
    full = sum(p.numel() * 4 for p in model.parameters())
    assert kept < (0.45 if fmt == "int8" else 0.3) * full or declined


@_host_has("avx512vnni")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_quantized_experts_follow_the_dequantized_float64_model(fmt, family):
    """A mixture of experts' stacked experts quantized (each expert packed alone) and read by
    routed products over one expert's packed words: decode's one row per routed expert and
    prefill's group of rows per expert, on the same tokens check."""
    model = _model(family, 112)
    lm = llm.compile(model, VNNI_TARGET, max_seq_len=48, weights=fmt,
                     device=device_for(VNNI_TARGET), cache=False)
    _check_tokens(lm, model, fmt, 112, 7, top_k=_MOE[family]["num_experts_per_tok"])
    weights = {e["name"]: e for e in lm.report if e["kind"] == "quant-weight"}
    experts = [e for name, e in weights.items() if "experts." in name]
    assert experts and all(e["status"] == "roller" for e in experts)
    # the router (8 rows) cannot take the format: declined with its reason
    assert all("multiples of 16" in e["reason"] for name, e in weights.items()
               if name.endswith("mlp.gate.weight"))
    assert not [e["name"] for e in lm.report if e.get("fallback") == "error"]
    # the integer kernels carry the roofline bound of one row
    kernels = [e for e in lm.report if e["kind"] == "quant-linear"]
    assert kernels and all(e["bound_s"] > 0 and "(one row)" in e["bound_by"] for e in kernels)


@_host_has("avx2")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_tokens_on_an_avx2_cpu(fmt):
    """Haswell (no AVX-512, no VNNI): the vpmaddubsw route, ymm only; the same tokens check."""
    model = _model("llama", 112)
    lm = llm.compile(model, AVX2_TARGET, max_seq_len=48, weights=fmt,
                     device=device_for(AVX2_TARGET), cache=False)
    _check_tokens(lm, model, fmt, 112, 5)
    assert any(e["kind"] == "quant-linear" for e in lm.report)
