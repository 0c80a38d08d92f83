"""A HuggingFace causal LM as one Relax module: ``prefill`` and ``decode`` over a paged cache
updated in place.

Both functions are ``torch.export``-ed from the same model with the "roller" attention
(``cache_ops``) and imported with the weights as parameters (``keep_params_as_input``), in the
same order, so one set of weight tensors serves both:

* ``prefill_transform_params((weights...)) -> prepared`` (run once: the transposes prefill's
  GEMMs want, ``LiftTransformParams``)
* ``prefill(ids[1, m], positions[1, m], tables[1, nb], lengths[1], keys, values, *prepared)
  -> (logits[1, vocab], keys, values)``: ``m`` positions of one sequence (a prompt, or a chunk
  of one continuing its cache)
* ``decode(ids[B, 1], positions[B, 1], tables[B, nb], lengths[B], keys, values, *weights)
  -> (logits[B, vocab], keys, values)``: one new position of each of ``B`` sequences (its
  projections GEMMs of ``B`` rows over the weights as torch holds them: ``FuseTransposeMatmul``)

``keys`` / ``values`` are the pool of cache blocks (``backends.cpu.kv_cache``; the pool's size a
shape variable), written in place; ``tables`` (int32) holds each sequence's pool blocks,
``lengths`` (int32) its length with the new positions, ``positions`` the new positions (RoPE's
and learned position embeddings' input); the returned caches are the same buffers.
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
              fmt: Optional[QuantFormat] = None, max_batch: int = 1) -> ExportedLM:
    """``prefill`` and ``decode`` of ``model`` (a ``*ForCausalLM`` in eval mode) as one module,
    its cache kernels planned for ``dev``; with ``fmt``, its linear weights quantized
    (``integrations.llm.quantize``); ``decode`` takes up to ``max_batch`` sequences (a shape
    variable above 1)."""
    if not _is_causal_lm(model):
        raise UnsupportedError(f"expected a transformers causal LM (*ForCausalLM, "
                               f"GPT2LMHeadModel), got {type(model).__name__}")
    from tvm_roller.integrations.llm.cache_convert import converters

    layout = cache_layout(model, max_seq_len, dev)
    prefill_ep, decode_ep = _export(model.eval(), layout, max_seq_len, max_batch)
    names = [_param_names(ep) for ep in (prefill_ep, decode_ep)]
    if names[0] != names[1]:
        raise UnsupportedError("prefill and decode take different weights")
    kernels: list = []
    prefill_mod, decode_mod = tvm.IRModule(), tvm.IRModule()
    _import(prefill_ep, "prefill", converters(kernels, "prefill", dev, layout), prefill_mod)
    _import(decode_ep, "decode", converters(kernels, "decode", dev, layout), decode_mod)
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


def _export(model, layout: CacheLayout, max_seq_len: int, max_batch: int):
    import torch

    from tvm_roller.integrations.llm.cache_ops import ATTENTION, register

    register()
    wrapper = _wrapper()
    Dim = torch.export.Dim
    m = Dim("chunk", min=2, max=max(3, max_seq_len))
    nb = Dim("blocks", min=1, max=max(2, layout.max_blocks))
    pool = Dim("pool", min=1, max=1 << 24)
    cache = ({2: pool}, {2: pool})
    keys, values = torch.zeros(layout.key_shape(3)), torch.zeros(layout.value_shape(3))
    tables = torch.zeros((1, 2), dtype=torch.int32)
    previous = model.config._attn_implementation
    try:
        model.config._attn_implementation = ATTENTION
        with torch.no_grad():
            # (distinct example tensors: one passed twice would be one input to torch.export)
            ids, positions = torch.zeros((1, 5), dtype=torch.long), torch.arange(5)[None]
            p = torch.export.export(
                wrapper(model, max_seq_len),
                (ids, positions, tables, torch.ones(1, dtype=torch.int32), keys, values),
                dynamic_shapes=({1: m}, {1: m}, {1: nb}, None) + cache)
            batch = 2 if max_batch > 1 else 1  # (an example of 1 would fix the size at 1)
            b = Dim("batch", min=1, max=max_batch) if max_batch > 1 else None
            ids, positions = torch.zeros((batch, 1), dtype=torch.long), torch.ones((batch, 1),
                                                                                 dtype=torch.long)
            d = torch.export.export(
                wrapper(model, max_seq_len),
                (ids, positions, tables.repeat(batch, 1), torch.ones(batch, dtype=torch.int32),
                 keys, values),
                dynamic_shapes=({0: b}, {0: b}, {0: b, 1: nb}, {0: b}) + cache)
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


def _wrapper():
    """The ``nn.Module`` wrapper ``torch.export`` sees (made on first use: torch and
    transformers are imported only by who compiles an LM)."""
    import torch
    from transformers.cache_utils import Cache, DynamicLayer

    from tvm_roller.integrations.llm.cache_ops import TraceState, trace_state

    class Layer(DynamicLayer):
        """A layer that holds nothing: the "roller" attention writes the cache buffers (each
        sequence's positions come as data: ``position_ids`` and the lengths)."""

        def update(self, key_states, value_states, *args, **kwargs):
            self.is_initialized = True
            return key_states, value_states

        def get_seq_length(self):
            return 0

        def get_mask_sizes(self, query_length):
            return query_length, 0

    class Step(torch.nn.Module):
        """The logits at each sequence's last new position; the new positions' keys and values
        written at ``[n - m, n)`` of each sequence (``n = lengths[s]``) through its table."""

        def __init__(self, model, max_seq_len: int):
            super().__init__()
            self.model, self.max_seq_len = model, max_seq_len

        def forward(self, ids, positions, tables, lengths, keys, values):
            state = TraceState(keys, values, tables, lengths, self.max_seq_len)
            # the logits of the last position only (the LM head a GEMV in prefill too)
            keep = {"logits_to_keep": 1} \
                if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {}
            token = trace_state().set(state)
            try:
                kv = Cache(layers=[Layer() for _ in range(keys.shape[0])])
                out = self.model(input_ids=ids, position_ids=positions, past_key_values=kv,
                                 use_cache=True, **keep)
            finally:
                trace_state().reset(token)
            return out.logits[:, -1, :], state.keys, state.values

    return Step
