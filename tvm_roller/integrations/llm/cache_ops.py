"""The torch side of the in-place cache: two custom ops ``torch.export`` keeps whole, and the
HuggingFace attention function and cache layer that call them.

* ``roller::kv_write(cache, new, marker, layer, keys)``: ``cache`` with ``new``
  (``[1, kv_heads, m, head_dim]``) written at positions ``[n - m, n)`` of ``layer``, ``n`` the
  marker's length (keys transposed: ``backends.cpu.kv_cache``). Functional here (a clone); the
  import (``cache_convert``) makes it an in-place write of m positions.
* ``roller::kv_attention(q, keys, values, marker, layer, scale)``: the causal attention of
  the ``m`` query positions ``[n - m, n)`` over positions ``[0, n)`` of ``layer`` (a decode
  step's one query, or a prompt's).

A model traced with the "roller" attention writes each layer's new keys and values through
``kv_write`` (threading the cache from layer to layer) and attends with ``kv_attention``: the
prompt and every step read the keys and values from the cache (no repeat of grouped-query
heads, no score matrix in memory: ``backends.cpu.kv_prompt_attention``).
"""
from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass
from typing import Optional

import torch

from tvm_roller.core.errors import UnsupportedError

ATTENTION = "roller"


@torch.library.custom_op("roller::kv_write", mutates_args=())
def kv_write(cache: torch.Tensor, new: torch.Tensor, marker: torch.Tensor, layer: int,
             keys: bool) -> torch.Tensor:
    out = cache.clone()
    n, m = marker.shape[0], new.shape[2]
    if keys:  # [kv, blocks, head_dim, block]: position p at (p // block, :, p % block)
        for j, p in enumerate(range(n - m, n)):
            out[layer, :, p // cache.shape[-1], :, p % cache.shape[-1]] = new[0, :, j]
    else:
        out[layer, :, n - m:n, :] = new[0]
    return out


@kv_write.register_fake
def _(cache, new, marker, layer, keys):
    return torch.empty_like(cache)


@torch.library.custom_op("roller::kv_attention", mutates_args=())
def kv_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 marker: torch.Tensor, layer: int, scale: float) -> torch.Tensor:
    n, heads, m = marker.shape[0], q.shape[1], q.shape[2]
    group = heads // keys.shape[1]
    blocked = keys[layer]                                                   # [kv, nb, d, b]
    k = blocked.permute(0, 1, 3, 2).reshape(blocked.shape[0], -1, blocked.shape[2])[:, :n]
    k = k.repeat_interleave(group, 0)                                       # [heads, n, d]
    v = values[layer, :, :n, :].repeat_interleave(group, 0)
    s = q[0] @ k.transpose(1, 2) * scale                                    # [heads, m, n]
    later = torch.arange(n)[None, :] > torch.arange(n - m, n)[:, None]      # causal
    p = torch.softmax(s.masked_fill(later, float("-inf")), dim=-1)
    return (p @ v).transpose(0, 1).unsqueeze(0).contiguous()                # [1, m, heads, d]


@kv_attention.register_fake
def _(q, keys, values, marker, layer, scale):
    return q.new_empty((1, q.shape[2], q.shape[1], q.shape[3]))


@dataclass
class TraceState:
    """The caches as they thread through the layers of the traced call, and the marker."""

    keys: torch.Tensor
    values: torch.Tensor
    marker: torch.Tensor
    max_seq_len: int


_STATE: contextvars.ContextVar[Optional[TraceState]] = contextvars.ContextVar("roller_kv_state",
                                                                             default=None)


def trace_state() -> contextvars.ContextVar:
    """Set around a traced call (``export``): the state the attention function threads."""
    return _STATE


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
              sliding_window=None, softcap=None, **kwargs):
    """HF's attention-function interface: the new keys / values into the cache, then the new
    positions' causal attention over the cache (HF's mask is not read: batch 1, no padding)."""
    state = _STATE.get()
    if state is None:
        raise UnsupportedError("the 'roller' attention runs only inside tvm_roller.llm's export")
    if softcap is not None:
        raise UnsupportedError("attention logit soft-capping is not supported yet")
    if sliding_window is not None and sliding_window < state.max_seq_len:
        raise UnsupportedError(f"sliding-window attention ({sliding_window} positions, below "
                               f"max_seq_len {state.max_seq_len}) is not supported yet")
    layer = module.layer_idx
    scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    state.keys = torch.ops.roller.kv_write(state.keys, key, state.marker, layer, True)
    state.values = torch.ops.roller.kv_write(state.values, value, state.marker, layer, False)
    out = torch.ops.roller.kv_attention(query, state.keys, state.values, state.marker, layer,
                                        scale)
    return out, None


def register() -> None:
    """The "roller" attention in HF's registries, with no mask (its kernels are causal)."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, _no_mask)


def _no_mask(*args, **kwargs):
    return None
