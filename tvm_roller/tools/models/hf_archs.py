"""A catalog of HuggingFace architectures at real models' sizes, built from their configs with
random weights (nothing downloaded), for the timed sweep (``python/sweep_hf_archs.py``).

Transformers get 2 layers at the hidden size of a real checkpoint of their family (named in
each entry) and 128 tokens; CNNs keep their full depth at 224x224; audio models take one second
of 16 kHz audio (wav2vec2-style) or their log-mel input (Whisper: 80 x 3000, AST: 1024 x 128).
Batch 1 unless asked. Each ``build(name, batch)`` returns ``(module, example_input)``: the module
in eval mode, wrapped to take one tensor and return its last hidden state.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from tvm_roller.tools.models.hf_export import LastHidden, randomize_norm_statistics

TOKENS = 128


@dataclass(frozen=True)
class Arch:
    """One architecture: its config class, the overrides (layers, sizes), the input kind and the
    model class when ``AutoModel`` would pick another (an encoder alone)."""

    config: str
    overrides: Dict[str, object] = field(default_factory=dict)
    kind: str = "text"  # text, image, audio, mel (Whisper), ast (log-mel patches)
    model: str = ""  # a transformers class name; "" = AutoModel.from_config
    family: str = "encoder"  # encoder, decoder, vision transformer, cnn, audio


def _two(**extra) -> Dict[str, object]:
    return dict(num_hidden_layers=2, **extra)


# name -> Arch; the comment names the checkpoint whose sizes are used
ARCHS: Dict[str, Arch] = {
    # -- text encoders ----------------------------------------------------------------------
    "bert": Arch("BertConfig", _two()),  # bert-base
    "roberta": Arch("RobertaConfig", _two()),  # roberta-base
    "distilbert": Arch("DistilBertConfig", dict(n_layers=2)),  # distilbert-base
    "albert": Arch("AlbertConfig", _two(hidden_size=768, num_attention_heads=12,
                                        intermediate_size=3072)),  # albert-base-v2
    "electra": Arch("ElectraConfig", _two(hidden_size=768, num_attention_heads=12,
                                          intermediate_size=3072, embedding_size=768)),
    "deberta_v2": Arch("DebertaV2Config", _two(hidden_size=768, num_attention_heads=12,
                                               intermediate_size=3072)),  # deberta-v3-base
    "mpnet": Arch("MPNetConfig", _two()),  # mpnet-base
    "modernbert": Arch("ModernBertConfig", _two()),  # ModernBERT-base
    "squeezebert": Arch("SqueezeBertConfig", _two()),  # squeezebert-uncased
    "t5_encoder": Arch("T5Config", dict(num_layers=2, d_model=768, d_kv=64, num_heads=12,
                                        d_ff=3072), model="T5EncoderModel"),  # t5-base
    # -- decoders (no KV cache here: whole-prompt forward) ---------------------------------
    "gpt2": Arch("GPT2Config", dict(n_layer=2, use_cache=False), family="decoder"),  # gpt2
    "llama": Arch("LlamaConfig", _two(hidden_size=576, intermediate_size=1536,
                                      num_attention_heads=9, num_key_value_heads=3,
                                      vocab_size=49152, use_cache=False),
                  family="decoder"),  # SmolLM2-135M (Llama)
    "qwen2": Arch("Qwen2Config", _two(hidden_size=896, intermediate_size=4864,
                                      num_attention_heads=14, num_key_value_heads=2,
                                      vocab_size=151936, use_cache=False),
                  family="decoder"),  # Qwen2.5-0.5B
    "phi3": Arch("Phi3Config", _two(hidden_size=3072, intermediate_size=8192,
                                    num_attention_heads=32, num_key_value_heads=32,
                                    vocab_size=32064, use_cache=False),
                 family="decoder"),  # Phi-3-mini
    "falcon": Arch("FalconConfig", _two(hidden_size=2048, num_attention_heads=32,
                                        multi_query=True, parallel_attn=True, use_cache=False),
                   family="decoder"),  # falcon-7b's layout (multi-query, parallel) at 2048
    "opt": Arch("OPTConfig", _two(use_cache=False), family="decoder"),  # opt-125m
    "bloom": Arch("BloomConfig", dict(n_layer=2, hidden_size=1024, n_head=16, use_cache=False),
                  family="decoder"),  # bloom-560m
    "gpt_neox": Arch("GPTNeoXConfig", _two(hidden_size=768, num_attention_heads=12,
                                           intermediate_size=3072, use_cache=False),
                     family="decoder"),  # pythia-160m
    # -- vision transformers ------------------------------------------------------------------
    "vit": Arch("ViTConfig", _two(), "image", family="vision transformer"),  # vit-base-patch16
    "deit": Arch("DeiTConfig", _two(), "image", family="vision transformer"),  # deit-base
    "beit": Arch("BeitConfig", _two(), "image", family="vision transformer"),  # beit-base
    "dinov2": Arch("Dinov2Config", _two(), "image", family="vision transformer"),  # dinov2-base
    "swin": Arch("SwinConfig", dict(depths=[2, 2, 2, 2]), "image",
                 family="vision transformer"),  # swin-tiny, 2 blocks a stage
    "siglip": Arch("SiglipVisionConfig", _two(image_size=224), "image",
                   family="vision transformer"),  # siglip-base-patch16-224
    "clip_vision": Arch("CLIPVisionConfig", _two(image_size=224, patch_size=16), "image",
                        family="vision transformer"),  # clip-vit-base-patch16
    "cvt": Arch("CvtConfig", {}, "image", family="vision transformer"),  # cvt-13
    "segformer": Arch("SegformerConfig", dict(depths=[2, 2, 2, 2]), "image",
                      family="vision transformer"),  # segformer-b0
    "mobilevit": Arch("MobileViTConfig", {}, "image", family="vision transformer"),  # mobilevit-s
    # -- CNNs (full depth) -------------------------------------------------------------------
    "resnet50": Arch("ResNetConfig", {}, "image", family="cnn"),  # resnet-50
    "convnext": Arch("ConvNextConfig", {}, "image", family="cnn"),  # convnext-tiny
    "mobilenet_v2": Arch("MobileNetV2Config", {}, "image", family="cnn"),
    "efficientnet": Arch("EfficientNetConfig", dict(width_coefficient=1.0, depth_coefficient=1.0,
                                                    hidden_dim=1280, image_size=224),
                         "image", family="cnn"),  # efficientnet-b0 (the config's default: b7)
    "regnet": Arch("RegNetConfig", {}, "image", family="cnn"),  # regnet-y-040
    "poolformer": Arch("PoolFormerConfig", {}, "image", family="cnn"),  # poolformer-s12
    # -- audio ----------------------------------------------------------------------------------
    "whisper_encoder": Arch("WhisperConfig", dict(encoder_layers=2), "mel", family="audio",
                            model="WhisperEncoder"),  # whisper-tiny's encoder
    "wav2vec2": Arch("Wav2Vec2Config", _two(), "audio", family="audio"),  # wav2vec2-base
    "wavlm": Arch("WavLMConfig", _two(), "audio", family="audio"),  # wavlm-base
    "hubert": Arch("HubertConfig", _two(), "audio", family="audio"),  # hubert-base
    "ast": Arch("ASTConfig", _two(), "ast", family="audio"),  # ast-finetuned-audioset
}


#: the config keys that count a model's layers, by family of config
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")


def build(name: str, batch: int = 1, tokens: int = TOKENS,
          layers: Optional[int] = None) -> Tuple[nn.Module, torch.Tensor]:
    """The architecture ``name`` with random weights, and a random input for it (``tokens``
    long for a text model; ``layers``: instead of the catalog's depth, for a transformer)."""
    import transformers

    arch = ARCHS[name]
    torch.manual_seed(0)
    overrides = dict(arch.overrides)
    if layers is not None:
        key = next((k for k in _LAYER_KEYS if k in overrides), None)
        if key is None:
            raise ValueError(f"{name} keeps its full depth: no layer count to set")
        overrides[key] = layers
    cfg = getattr(transformers, arch.config)(**overrides)
    cfg._attn_implementation = "eager"
    if arch.model == "WhisperEncoder":
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        model = WhisperEncoder(cfg)
    elif arch.model:
        model = getattr(transformers, arch.model)(cfg)
    else:
        model = transformers.AutoModel.from_config(cfg)
    randomize_norm_statistics(model)
    model.eval()
    x, arg = _input(arch, cfg, batch, tokens)
    return LastHidden(model, arg).eval(), x


def _input(arch: Arch, cfg, batch: int, tokens: int) -> Tuple[torch.Tensor, str]:
    gen = torch.Generator().manual_seed(0)
    if arch.kind == "text":
        return torch.randint(0, cfg.vocab_size, (batch, tokens), generator=gen), "input_ids"
    if arch.kind == "image":
        return torch.randn(batch, 3, 224, 224, generator=gen), "pixel_values"
    if arch.kind == "audio":
        return torch.randn(batch, 16000, generator=gen), "input_values"
    if arch.kind == "mel":
        return torch.randn(batch, cfg.num_mel_bins, 2 * cfg.max_source_positions,
                           generator=gen), "input_features"
    if arch.kind == "ast":
        return torch.randn(batch, cfg.max_length, cfg.num_mel_bins, generator=gen), \
            "input_values"
    raise ValueError(f"unknown input kind {arch.kind!r}")
