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


def _model(family: str, vocab: int):
    cfg_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                          "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[
        family]
    torch.manual_seed(7)
    extra = {"sliding_window": None, "tie_word_embeddings": True} if family == "qwen2" else {}
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
    """A float64 copy whose every matrix the format takes holds its dequantized values."""
    f = FORMATS[fmt]
    ref = copy.deepcopy(model).double()
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 2 and shape_reason(f, *p.shape) is None:
                w = p.detach().float().numpy()
                p.copy_(torch.from_numpy(dequantize(f, *quantize(f, w))))
    return ref


def _check_tokens(lm, model, fmt: str, vocab: int, prompt: int) -> None:
    """32 greedy tokens, each the dequantized float64 model's argmax or within its margin."""
    ids = torch.randint(0, vocab, (1, prompt), generator=torch.Generator().manual_seed(prompt))
    out = lm.generate(ids, 32)
    with torch.no_grad():
        logits = _dequantized(model, fmt)(out).logits[0, prompt - 1:-1].numpy()
    chosen = logits[np.arange(len(logits)), out[0, prompt:].numpy()]
    gap = logits.max(-1) - chosen
    # the activations' 8-bit rounding moves a logit by well under 2% of the logits' spread
    assert (gap <= 0.02 * logits.std()).all(), gap.max() / logits.std()
    assert (gap == 0).mean() >= 0.9


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


@_host_has("avx2")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_tokens_on_an_avx2_cpu(fmt):
    """Haswell (no AVX-512, no VNNI): the vpmaddubsw route, ymm only; the same tokens check."""
    model = _model("llama", 112)
    lm = llm.compile(model, AVX2_TARGET, max_seq_len=48, weights=fmt,
                     device=device_for(AVX2_TARGET), cache=False)
    _check_tokens(lm, model, fmt, 112, 5)
    assert any(e["kind"] == "quant-linear" for e in lm.report)
