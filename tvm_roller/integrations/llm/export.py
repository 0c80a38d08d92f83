"""A HuggingFace causal LM as one Relax module: ``prefill`` and ``decode`` over an explicit cache.

Both functions are ``torch.export``-ed from the same model and imported with the weights as
parameters (``keep_params_as_input``), in the same order, so one set of weight tensors serves
both (the weights are held once):

* ``transform_params((weights...)) -> prepared`` (run once: the weights' transposes lifted out
  of both functions, ``LiftTransformParams``)
* ``prefill(ids[1, n], *prepared) -> (logits[1, vocab], keys, values)``
* ``decode(ids[1, 1], keys, values, *prepared) -> (logits[1, vocab], keys', values')``

``keys`` / ``values`` are ``[layers, 1, kv_heads, length, head_dim]``. The cache is functional
here: ``decode`` returns the cache one token longer, a copy of it per step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import tvm
from tvm import relax

from tvm_roller.core.errors import UnsupportedError

# the families the tests generate with against HF (others are tried, and declined with the
# reason when export or import fails; Qwen3, OLMo and Gemma are not tested yet)
TESTED_FAMILIES = ("llama", "mistral", "qwen2", "phi3", "gpt2")


@dataclass(frozen=True)
class CacheShape:
    """The cache's dimensions: ``[layers, 1, kv_heads, length, head_dim]``."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "float32"


@dataclass(frozen=True)
class ExportedLM:
    """The module (``prefill`` and ``decode``), the weights both take after their inputs, and the
    cache's shape."""

    mod: tvm.IRModule
    weights: Tuple[object, ...]  # torch tensors, in the functions' parameter order
    cache: CacheShape
    vocab: int


def cache_shape(model) -> CacheShape:
    """The cache's dimensions from the model's config (declines what the cache cannot hold)."""
    cfg = model.config
    layers = _first(cfg, "num_hidden_layers", "n_layer")
    heads = _first(cfg, "num_attention_heads", "n_head")
    hidden = _first(cfg, "hidden_size", "n_embd")
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True) \
            and getattr(cfg, "layer_types", None) and "sliding_attention" in cfg.layer_types:
        raise UnsupportedError(f"{cfg.model_type}: sliding-window attention layers are not "
                               "supported yet (the cache keeps every position)")
    return CacheShape(int(layers), int(kv), int(head_dim))


def _is_causal_lm(model) -> bool:
    """A decoder-only transformers model with an LM head."""
    head = getattr(model, "get_output_embeddings", None)
    cfg = getattr(model, "config", None)
    return cfg is not None and head is not None and head() is not None \
        and not getattr(cfg, "is_encoder_decoder", False)


def _first(cfg, *names):
    for name in names:
        if getattr(cfg, name, None) is not None:
            return getattr(cfg, name)
    raise UnsupportedError(f"{cfg.model_type}: the config has none of {', '.join(names)}")


def export_lm(model, max_seq_len: int) -> ExportedLM:
    """``prefill`` and ``decode`` of ``model`` (a ``*ForCausalLM`` in eval mode) as one module."""
    if not _is_causal_lm(model):
        raise UnsupportedError(f"expected a transformers causal LM (*ForCausalLM, "
                               f"GPT2LMHeadModel), got {type(model).__name__}")
    shape = cache_shape(model)
    model = model.eval()
    prefill_ep, decode_ep = _export(model, shape, max_seq_len)
    names = [_param_names(ep) for ep in (prefill_ep, decode_ep)]
    if names[0] != names[1]:
        raise UnsupportedError("prefill and decode take different weights")
    mod = tvm.IRModule({"prefill": _import(prefill_ep, "prefill"),
                        "decode": _import(decode_ep, "decode")})
    # what only depends on the weights (the transposes of every Linear's weight) into one
    # ``transform_params`` run once at load: otherwise each call copies every weight
    mod = relax.transform.LiftTransformParams(shared_transform=True)(mod)
    weights = tuple(prefill_ep.state_dict[n].detach() for n in names[0])
    vocab = int(model.get_output_embeddings().weight.shape[0])
    return ExportedLM(mod, weights, shape, vocab)


def _export(model, shape: CacheShape, max_seq_len: int):
    import torch

    prefill_cls, decode_cls = _wrappers()
    prefill, decode = prefill_cls(model, shape), decode_cls(model)
    n = torch.export.Dim.DYNAMIC(min=2, max=max_seq_len)
    past = torch.export.Dim.DYNAMIC(min=1, max=max_seq_len - 1)
    ids = torch.zeros((1, 5), dtype=torch.long)
    cache = torch.zeros((shape.layers, 1, shape.kv_heads, 5, shape.head_dim))
    try:
        with torch.no_grad():
            p = torch.export.export(prefill, (ids,), dynamic_shapes=({1: n},))
            d = torch.export.export(decode, (ids[:, :1], cache, cache.clone()),
                                    dynamic_shapes=(None, {3: past}, {3: past}))
    except Exception as err:  # noqa: BLE001  (torch.export's many error types: a decline)
        raise UnsupportedError(f"{model.config.model_type}: torch.export failed "
                               f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") \
            from err
    return p, d


def _param_names(ep) -> List[str]:
    from torch.export.graph_signature import InputKind

    return [s.target for s in ep.graph_signature.input_specs if s.kind is InputKind.PARAMETER]


def _import(ep, name: str):
    from tvm.relax.frontend.torch import from_exported_program

    # the weights travel as arguments (one set for both functions), not as an attribute
    func = from_exported_program(ep, keep_params_as_input=True)["main"]
    return func.without_attr("params").with_attr("global_symbol", name)


def _stack(cache) -> tuple:
    import torch

    return (torch.stack([layer.keys for layer in cache.layers]),
            torch.stack([layer.values for layer in cache.layers]))


def _wrappers():
    """The two ``nn.Module`` wrappers ``torch.export`` sees (made on first use: torch and
    transformers are imported only by who compiles an LM)."""
    import torch
    from transformers.cache_utils import Cache, DynamicLayer

    class Layer(DynamicLayer):
        """HF's layer starts from a 1-D ``tensor([])`` it concatenates onto (TVM's concat
        wants equal ranks): this one from the first keys' shape with no positions."""

        def lazy_initialization(self, key_states, value_states):
            super().lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]

    def cache(layers: int) -> Cache:
        return Cache(layers=[Layer() for _ in range(layers)])

    class Prefill(torch.nn.Module):
        """The prompt's logits at its last position and its whole cache."""

        def __init__(self, model, shape: CacheShape):
            super().__init__()
            self.model, self.layers = model, shape.layers

        def forward(self, ids):
            kv = cache(self.layers)
            out = self.model(input_ids=ids, past_key_values=kv, use_cache=True)
            return (out.logits[:, -1, :],) + _stack(kv)

    class Decode(torch.nn.Module):
        """One token's logits against the cache, and the cache one token longer."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids, keys, values):
            kv = cache(keys.shape[0])
            for i, layer in enumerate(kv.layers):
                layer.update(keys[i], values[i])
            out = self.model(input_ids=ids, past_key_values=kv, use_cache=True)
            return (out.logits[:, -1, :],) + _stack(kv)

    return Prefill, Decode
