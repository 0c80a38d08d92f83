"""A HuggingFace causal LM as one Relax module: ``prefill`` and ``decode`` over a cache updated
in place.

Both functions are ``torch.export``-ed from the same model with the "roller" attention
(``cache_ops``) and imported with the weights as parameters (``keep_params_as_input``), in the
same order, so one set of weight tensors serves both:

* ``prefill_transform_params((weights...)) -> prepared`` (run once: the transposes prefill's
  GEMMs want, ``LiftTransformParams``)
* ``prefill(ids[1, n], keys, values, *prepared) -> (logits[1, vocab], keys, values)``
* ``decode(ids[1, 1], keys, values, marker[n], *weights) -> (logits[1, vocab], keys, values)``
  (its GEMVs read the weights as torch holds them: ``FuseTransposeMatmul``)

``keys`` / ``values`` are the cache buffers of ``max_seq_len`` positions (rounded up to whole
attention blocks: ``backends.cpu.kv_cache``), written in place: a prompt's positions by
``prefill``, the one new position (``n - 1``, ``n`` the marker's length) by ``decode``; the
returned caches are the same buffers.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import List, Optional, Tuple

import tvm
from tvm import relax

from tvm_roller.backends.cpu.kv_cache import CacheLayout, padded_length
from tvm_roller.backends.cpu.attention_plan import plan_tiles
from tvm_roller.backends.cpu.quant_format import QuantFormat
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware.model import DeviceModel
from tvm_roller.integrations.llm.quantize import quantize_lm

# the families the tests generate with against HF (others are tried, and declined with the
# reason when export or import fails; Gemma 2 / 3's soft-capping and sliding windows are declined)
TESTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "olmo", "olmo2", "gemma",
                   "gpt2", "mixtral", "qwen2_moe")


@dataclass(frozen=True)
class ExportedLM:
    """The module (``prefill`` and ``decode``), the weights both take after their inputs, the
    cache's layout and the kernels the cache ops added (report entries)."""

    mod: tvm.IRModule
    weights: Tuple[object, ...]  # torch tensors, in the functions' parameter order (a
    # quantized weight: its packed words and scales, numpy arrays)
    cache: CacheLayout
    vocab: int
    kernels: Tuple[dict, ...]


def cache_layout(model, max_seq_len: int, dev: DeviceModel) -> CacheLayout:
    """The cache's dimensions from the model's config (declines what the cache cannot hold),
    in blocks of positions planned for ``dev`` (``attention_plan``)."""
    cfg = model.config
    layers = _first(cfg, "num_hidden_layers", "n_layer")
    heads = _first(cfg, "num_attention_heads", "n_head")
    hidden = _first(cfg, "hidden_size", "n_embd")
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    if heads % kv:
        raise UnsupportedError(f"{cfg.model_type}: {heads} query heads over {kv} kv heads")
    block = plan_tiles(dev, int(head_dim), max_seq_len, int(heads) // int(kv)).block
    return CacheLayout(int(layers), int(kv), int(head_dim), padded_length(max_seq_len, block),
                       int(heads), block)


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


def export_lm(model, max_seq_len: int, dev: DeviceModel,
              fmt: Optional[QuantFormat] = None) -> ExportedLM:
    """``prefill`` and ``decode`` of ``model`` (a ``*ForCausalLM`` in eval mode) as one module,
    its cache kernels planned for ``dev``; with ``fmt``, its linear weights quantized
    (``integrations.llm.quantize``)."""
    if not _is_causal_lm(model):
        raise UnsupportedError(f"expected a transformers causal LM (*ForCausalLM, "
                               f"GPT2LMHeadModel), got {type(model).__name__}")
    from tvm_roller.integrations.llm.cache_convert import converters

    layout = cache_layout(model, max_seq_len, dev)
    prefill_ep, decode_ep = _export(model.eval(), layout, max_seq_len)
    names = [_param_names(ep) for ep in (prefill_ep, decode_ep)]
    if names[0] != names[1]:
        raise UnsupportedError("prefill and decode take different weights")
    kernels: list = []
    prefill_mod, decode_mod = tvm.IRModule(), tvm.IRModule()
    _import(prefill_ep, "prefill", converters(kernels, "prefill", dev), prefill_mod)
    _import(decode_ep, "decode", converters(kernels, "decode", dev), decode_mod)
    weights = tuple(prefill_ep.state_dict[n].detach() for n in names[0])
    if fmt is not None:
        mods, weights = quantize_lm({"prefill": prefill_mod, "decode": decode_mod}, names[0],
                                    weights, fmt, kernels)
        prefill_mod, decode_mod = mods["prefill"], mods["decode"]
    # decode's matmuls are GEMVs: over the weights as torch holds them (rows of dot products
    # along contiguous memory, read in place), not over their transposes
    decode_mod = relax.transform.FuseTransposeMatmul()(decode_mod)
    # what only depends on the weights in prefill (the transposes of every Linear's weight:
    # its GEMMs want them) into ``prefill_transform_params``, run once at load
    mod = relax.transform.LiftTransformParams()(prefill_mod)
    for gv, func in decode_mod.functions_items():
        mod[gv] = func
    vocab = int(model.get_output_embeddings().weight.shape[0])
    return ExportedLM(mod, weights, layout, vocab, tuple(kernels))


def _export(model, layout: CacheLayout, max_seq_len: int):
    import torch

    from tvm_roller.integrations.llm.cache_ops import ATTENTION, register

    register()
    prefill_cls, decode_cls = _wrappers()
    prefill, decode = prefill_cls(model, max_seq_len), decode_cls(model, max_seq_len)
    n = torch.export.Dim.DYNAMIC(min=2, max=max_seq_len)
    ids = torch.zeros((1, 5), dtype=torch.long)
    keys, values = torch.zeros(layout.key_shape), torch.zeros(layout.value_shape)
    marker = torch.zeros((5,), dtype=torch.long)
    previous = model.config._attn_implementation
    try:
        model.config._attn_implementation = ATTENTION
        with torch.no_grad():
            p = torch.export.export(prefill, (ids, keys, values),
                                    dynamic_shapes=({1: n}, None, None))
            d = torch.export.export(decode, (ids[:, :1], keys, values, marker),
                                    dynamic_shapes=(None, None, None, {0: n}))
    except UnsupportedError:
        raise
    except Exception as err:  # noqa: BLE001  (torch.export's many error types: a decline)
        raise UnsupportedError(f"{model.config.model_type}: torch.export failed "
                               f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") \
            from err
    finally:
        model.config._attn_implementation = previous
    return p, d


def _param_names(ep) -> List[str]:
    from torch.export.graph_signature import InputKind

    return [s.target for s in ep.graph_signature.input_specs if s.kind is InputKind.PARAMETER]


def _import(ep, name: str, convert: dict, into: tvm.IRModule) -> None:
    """``ep`` as the Relax function ``name`` in ``into``, with the kernels its cache ops added
    (each function's named apart: ``converters``' prefix)."""
    from tvm.relax.frontend.torch import from_exported_program

    from tvm_roller.integrations.pytorch import convert_map
    from tvm_roller.integrations.pytorch.emit import with_prefix

    # the weights travel as arguments (one set for both functions), not as an attribute
    mod = from_exported_program(ep, keep_params_as_input=True, custom_convert_map={
        **with_prefix(convert_map(), f"{name}_"), **convert})
    for gv, func in mod.functions_items():
        if gv.name_hint == "main":
            into[name] = func.without_attr("params").with_attr("global_symbol", name)
        else:
            into[gv] = func


def _wrappers():
    """The two ``nn.Module`` wrappers ``torch.export`` sees (made on first use: torch and
    transformers are imported only by who compiles an LM)."""
    import torch
    from transformers.cache_utils import Cache, DynamicLayer

    from tvm_roller.integrations.llm.cache_ops import TraceState, trace_state

    class Layer(DynamicLayer):
        """A layer that holds nothing: the "roller" attention writes the cache buffers; this
        only tells HF how many positions came before (``past``)."""

        def __init__(self, past):
            super().__init__()
            self.past = past

        def update(self, key_states, value_states, *args, **kwargs):
            self.is_initialized = True
            return key_states, value_states

        def get_seq_length(self):
            return self.past

        def get_mask_sizes(self, query_length):
            return self.past + query_length, 0

    def traced(model, state: TraceState, ids, past):
        # the logits of the last position only (the LM head a GEMV in prefill too)
        keep = {"logits_to_keep": 1} \
            if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        token = trace_state().set(state)
        try:
            kv = Cache(layers=[Layer(past) for _ in range(state.keys.shape[0])])
            out = model(input_ids=ids, past_key_values=kv, use_cache=True, **keep)
        finally:
            trace_state().reset(token)
        return out.logits[:, -1, :], state.keys, state.values

    class Prefill(torch.nn.Module):
        """The prompt's logits at its last position; its keys and values written at
        ``[0, n)``."""

        def __init__(self, model, max_seq_len: int):
            super().__init__()
            self.model, self.max_seq_len = model, max_seq_len

        def forward(self, ids, keys, values):
            state = TraceState(keys, values, ids[0], self.max_seq_len)
            return traced(self.model, state, ids, 0)

    class Decode(torch.nn.Module):
        """One token's logits against positions ``[0, n - 1)``, its keys and values written at
        ``n - 1`` (``n`` the marker's length)."""

        def __init__(self, model, max_seq_len: int):
            super().__init__()
            self.model, self.max_seq_len = model, max_seq_len

        def forward(self, ids, keys, values, marker):
            state = TraceState(keys, values, marker, self.max_seq_len)
            return traced(self.model, state, ids, marker.shape[0] - 1)

    return Prefill, Decode
