"""HuggingFace architectures built from their configs with random weights (nothing downloaded).

Each factory takes ``size`` ("small": a few layers and small hidden sizes, for tests; "full": the
real architecture's sizes) and returns ``(module, example_input)``: the module is in eval mode and
wrapped so that it takes one tensor and returns one tensor (the last hidden state or the logits),
which is what ``torch.export`` -> Relax -> ``tvm_roller.relax.compile`` handles end to end.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
from torch import nn

from tvm_roller.tools.models.hf_export import LastHidden, randomize_norm_statistics


class _WithMask(nn.Module):
    """Token ids in, with an attention mask (all ones but the last quarter of the tokens)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(ids)
        mask[:, ids.shape[1] - ids.shape[1] // 4:] = 0
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def _eval(model: nn.Module) -> nn.Module:
    randomize_norm_statistics(model)
    model.eval()
    return model


def _config(cls, size: str, small: dict, full: Optional[dict] = None,
            attention: bool = True):
    """An architecture's config, seeded: ``full`` (default: the real model's sizes) or
    ``small``; eager attention (the one that exports)."""
    torch.manual_seed(0)
    cfg = cls(**(full or {})) if size == "full" else cls(**small)
    if attention:
        cfg._attn_implementation = "eager"
    return cfg


def _tokens(vocab: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(0))


def bert(size: str = "small", seq: int = 128, mask: bool = True):
    from transformers import BertConfig, BertModel

    cfg = _config(BertConfig, size, dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        vocab_size=1000, max_position_embeddings=256))
    model = BertModel(cfg, add_pooling_layer=False)
    wrapped = _WithMask(model) if mask else LastHidden(model, "input_ids")
    return _eval(wrapped), _tokens(cfg.vocab_size, seq)


def gpt2(size: str = "small", seq: int = 128):
    from transformers import GPT2Config, GPT2Model

    cfg = _config(GPT2Config, size, dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000,
                                         n_positions=256))
    cfg.use_cache = False  # no key/value cache: its empty tensors do not export
    return _eval(LastHidden(GPT2Model(cfg), "input_ids")), _tokens(cfg.vocab_size, seq)


def llama(size: str = "small", seq: int = 128):
    """A Llama-style decoder (RMSNorm, rotary embeddings, SiLU-gated MLP, causal mask):
    "small" is hidden 768 in 2 layers (what the tests build), "full" 12 layers."""
    from transformers import LlamaConfig, LlamaModel

    common = dict(hidden_size=768, intermediate_size=2048, num_attention_heads=12,
                  num_key_value_heads=12, max_position_embeddings=2048)
    cfg = _config(LlamaConfig, size, dict(common, num_hidden_layers=2, vocab_size=1000),
                  dict(common, num_hidden_layers=12, vocab_size=32000))
    cfg.use_cache = False
    return _eval(LastHidden(LlamaModel(cfg), "input_ids")), _tokens(cfg.vocab_size, seq)


def vit(size: str = "small"):
    from transformers import ViTConfig, ViTModel

    cfg = _config(ViTConfig, size, dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=64, patch_size=8))
    model = ViTModel(cfg, add_pooling_layer=False)
    x = torch.randn(1, 3, cfg.image_size, cfg.image_size)
    return _eval(LastHidden(model, "pixel_values")), x


def resnet(size: str = "small"):
    from transformers import ResNetConfig, ResNetModel

    cfg = _config(ResNetConfig, size, dict(
        embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
        layer_type="bottleneck"), attention=False)
    image = 224 if size == "full" else 64
    return _eval(LastHidden(ResNetModel(cfg), "pixel_values")), torch.randn(1, 3, image, image)


def mobilenet_v2(size: str = "small"):
    from transformers import MobileNetV2Config, MobileNetV2Model

    cfg = _config(MobileNetV2Config, size, dict(depth_multiplier=0.35, image_size=64),
                  attention=False)
    image = 224 if size == "full" else 64
    model = MobileNetV2Model(cfg, add_pooling_layer=False)
    return _eval(LastHidden(model, "pixel_values")), torch.randn(1, 3, image, image)


def whisper_encoder(size: str = "small"):
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = _config(WhisperConfig, size, dict(
        d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
        num_mel_bins=16, max_source_positions=50), dict(
        d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
        num_mel_bins=80, max_source_positions=1500))
    frames = 2 * cfg.max_source_positions
    x = torch.randn(1, cfg.num_mel_bins, frames)
    return _eval(LastHidden(WhisperEncoder(cfg), "input_features")), x


def eager_experts(model: nn.Module) -> nn.Module:
    """``model`` with HF's eager experts: PyTorch's grouped_mm takes no float64, so a float64
    reference of a mixture-of-experts model runs them instead."""
    for m in model.modules():
        if getattr(m, "config", None) is not None and hasattr(m.config, "_experts_implementation"):
            m.config._experts_implementation = "eager"
    return model


def _moe(cls, model_cls, size: str, seq: int, small: dict, full: dict):
    """A mixture-of-experts decoder: "small" for tests, "full" with ≥ 1 GB of fp32 experts."""
    cfg = _config(cls, size, small, full)
    cfg.use_cache = False
    return _eval(LastHidden(model_cls(cfg), "input_ids")), _tokens(cfg.vocab_size, seq)


def mixtral(size: str = "small", seq: int = 128):
    """Mixtral-style: every layer's MLP is 8 experts, top-2, renormalised weights."""
    from transformers import MixtralConfig, MixtralModel

    common = dict(num_attention_heads=8, num_key_value_heads=4, num_local_experts=8,
                  num_experts_per_tok=2, vocab_size=1000, max_position_embeddings=2048)
    return _moe(MixtralConfig, MixtralModel, size, seq,
                dict(common, hidden_size=64, intermediate_size=96, num_hidden_layers=2),
                dict(common, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4))


def qwen2_moe(size: str = "small", seq: int = 128):
    """Qwen-MoE-style: many small experts, top-k, a gated shared expert."""
    from transformers import Qwen2MoeConfig, Qwen2MoeModel

    common = dict(num_attention_heads=8, num_key_value_heads=4, num_experts=16,
                  num_experts_per_tok=4, vocab_size=1000, max_position_embeddings=2048,
                  norm_topk_prob=True)
    return _moe(Qwen2MoeConfig, Qwen2MoeModel, size, seq,
                dict(common, hidden_size=64, moe_intermediate_size=32,
                     shared_expert_intermediate_size=96, intermediate_size=96,
                     num_hidden_layers=2),
                dict(common, hidden_size=1024, moe_intermediate_size=704,
                     shared_expert_intermediate_size=2816, intermediate_size=2816,
                     num_hidden_layers=4))


MODELS: Dict[str, Callable[..., Tuple[nn.Module, torch.Tensor]]] = {
    "bert": bert, "gpt2": gpt2, "llama": llama, "vit": vit, "resnet": resnet,
    "mobilenet_v2": mobilenet_v2, "whisper_encoder": whisper_encoder, "mixtral": mixtral,
    "qwen2_moe": qwen2_moe,
}
