"""Causal LMs at real models' shapes with random weights (no download): what
``tvm-roller generate`` and ``python/bench_llm.py`` build by name."""
from __future__ import annotations

from typing import Dict, Tuple

CONFIGS: Dict[str, Tuple[str, dict]] = {
    # Qwen2-0.5B: 24 layers, hidden 896, 14 / 2 heads, MLP 4864, vocab 151936, tied
    "qwen2-0.5b": ("Qwen2", dict(num_hidden_layers=24, hidden_size=896, num_attention_heads=14,
                                 num_key_value_heads=2, intermediate_size=4864,
                                 vocab_size=151936, tie_word_embeddings=True,
                                 max_position_embeddings=32768)),
    # Llama-3.2-1B: 16 layers, hidden 2048, 32 / 8 heads, MLP 8192, vocab 128256, tied
    "llama-3.2-1b": ("Llama", dict(num_hidden_layers=16, hidden_size=2048,
                                   num_attention_heads=32, num_key_value_heads=8,
                                   intermediate_size=8192, vocab_size=128256,
                                   tie_word_embeddings=True, max_position_embeddings=131072)),
    # a Mixtral-style MoE whose fp32 experts hold 1.1 GB: 4 layers, hidden 1024, 8 experts of
    # MLP 2816, top-2 (decode reads 2 of 8 experts a layer)
    "mixtral-1g": ("Mixtral", dict(num_hidden_layers=4, hidden_size=1024, num_attention_heads=16,
                                   num_key_value_heads=8, intermediate_size=2816,
                                   num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                                   sliding_window=None, max_position_embeddings=4096)),
    "tiny": ("Llama", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=96, vocab_size=97,
                           max_position_embeddings=4096)),
}


def build(name: str, seed: int = 0):
    """``(model, config)``: the named configuration with random weights, in eval mode."""
    import torch
    import transformers

    if name not in CONFIGS:
        raise ValueError(f"unknown config {name!r} (known: {', '.join(sorted(CONFIGS))})")
    family, kw = CONFIGS[name]
    cfg = getattr(transformers, f"{family}Config")(**kw)
    torch.manual_seed(seed)
    return getattr(transformers, f"{family}ForCausalLM")(cfg).eval(), cfg
