"""The torch side of the paged cache: two custom ops ``torch.export`` keeps whole, and the
HuggingFace attention function and cache layer that call them.

* ``roller::kv_write(cache, new, tables, lengths, layer, keys)``: ``cache`` with ``new``
  (``[batch, kv_heads, m, head_dim]``) written at positions ``[n - m, n)`` of each sequence
  (``n = lengths[s]``) of ``layer``, through its block table (``tables[s]``: the pool blocks
  of its positions; layout: ``backends.cpu.kv_cache``). Functional here (a clone); the import
  (``cache_convert``) makes it an in-place write of m positions a sequence.
* ``roller::kv_attention(q, keys, values, tables, lengths, layer, scale)``: the causal
  attention of each sequence's ``m`` query positions ``[n - m, n)`` over its positions
  ``[0, n)`` of ``layer`` (a decode step's one query per sequence, or a prompt chunk's).

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
def kv_write(cache: torch.Tensor, new: torch.Tensor, tables: torch.Tensor,
             lengths: torch.Tensor, layer: int, keys: bool) -> torch.Tensor:
    out = cache.clone()
    m, block = new.shape[2], cache.shape[-1] if keys else cache.shape[-2]
    for s in range(new.shape[0]):
        n = int(lengths[s])
        for j, p in enumerate(range(n - m, n)):
            blk = int(tables[s, p // block])
            if keys:  # [kv, pool, head_dim, block]
                out[layer, :, blk, :, p % block] = new[s, :, j]
            else:  # [kv, pool, block, head_dim]
                out[layer, :, blk, p % block, :] = new[s, :, j]
    return out


@kv_write.register_fake
def _(cache, new, tables, lengths, layer, keys):
    return torch.empty_like(cache)


def gathered(keys: torch.Tensor, values: torch.Tensor, table, n: int, layer: int):
    """One sequence's first ``n`` keys and values of ``layer`` by position (``[kv, n, d]``
    each), read through its block table."""
    block = keys.shape[-1]
    used = [int(b) for b in table[:-(-n // block)]]
    k = keys[layer][:, used].permute(0, 1, 3, 2).reshape(keys.shape[1], -1, keys.shape[3])
    v = values[layer][:, used].reshape(values.shape[1], -1, values.shape[4])
    return k[:, :n], v[:, :n]


@torch.library.custom_op("roller::kv_attention", mutates_args=())
def kv_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 tables: torch.Tensor, lengths: torch.Tensor, layer: int,
                 scale: float) -> torch.Tensor:
    heads, m = q.shape[1], q.shape[2]
    group = heads // keys.shape[1]
    outs = []
    for s in range(q.shape[0]):
        n = int(lengths[s])
        k, v = gathered(keys, values, tables[s], n, layer)
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # [heads, n, d]
        sc = q[s] @ k.transpose(1, 2) * scale                                # [heads, m, n]
        later = torch.arange(n)[None, :] > torch.arange(n - m, n)[:, None]  # causal
        p = torch.softmax(sc.masked_fill(later, float("-inf")), dim=-1)
        outs.append((p @ v).transpose(0, 1))                                # [m, heads, d]
    return torch.stack(outs).contiguous()


@kv_attention.register_fake
def _(q, keys, values, tables, lengths, layer, scale):
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3]))


@dataclass
class TraceState:
    """The caches as they thread through the layers of the traced call, the block tables and
    the lengths."""

    keys: torch.Tensor
    values: torch.Tensor
    tables: torch.Tensor
    lengths: torch.Tensor
    max_seq_len: int


_STATE: contextvars.ContextVar[Optional[TraceState]] = contextvars.ContextVar("roller_kv_state",
                                                                             default=None)


def trace_state() -> contextvars.ContextVar:
    """Set around a traced call (``export``): the state the attention function threads."""
    return _STATE


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
              sliding_window=None, softcap=None, **kwargs):
    """HF's attention-function interface: the new keys / values into the cache, then the new
    positions' causal attention over the cache (HF's mask is not read: each sequence's own
    positions, no padding)."""
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
    tables, lengths = state.tables, state.lengths
    state.keys = torch.ops.roller.kv_write(state.keys, key, tables, lengths, layer, True)
    state.values = torch.ops.roller.kv_write(state.values, value, tables, lengths, layer, False)
    out = torch.ops.roller.kv_attention(query, state.keys, state.values, tables, lengths, layer,
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
