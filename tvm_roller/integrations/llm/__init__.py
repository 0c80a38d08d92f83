"""LLM generation: a HuggingFace causal LM compiled by roller into ``prefill`` and ``decode``.

    lm = tvm_roller.llm.compile(model, max_seq_len=2048)
    out = lm.generate(input_ids, max_new_tokens=64)      # [1, n + k], greedy
    for token in lm.stream(input_ids, 64, do_sample=True, top_p=0.9, seed=0): ...
    lm.stats                                             # prefill / decode seconds and tokens

    lm = tvm_roller.llm.load("path/to/model", max_seq_len=512)   # the model and its tokenizer
    lm.generate_text("Once upon a time", max_tokens=32).text
    for chunk in lm.stream_text([{"role": "user", "content": "Hi"}], 32): print(chunk.text)

The key/value cache is paged: a pool of fixed-size blocks, each sequence's positions listed
in its block table, written in place (``export``, ``backends.cpu.kv_cache``): a decode step
reads the weights and the cache once and writes one position a sequence. ``generate`` and
``stream`` run one sequence (its table the pool's blocks in order); ``compile(...,
max_batch=N)`` lets ``decode`` take up to N sequences a call, and ``batch.BatchGenerator``
schedules many sequences over a shared pool (continuous batching, as ``tvm-roller serve
--max-batch`` runs it).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Union

import numpy as np
import tvm

from tvm_roller.hardware import HOST_TARGET, DeviceModel
from tvm_roller.backends.cpu.kv_cache import CacheLayout
from tvm_roller.integrations.llm.batch import BatchGenerator
from tvm_roller.integrations.llm.bounds import one_row_bounds
from tvm_roller.integrations.llm.export import TESTED_FAMILIES, export_lm
from tvm_roller.integrations.llm.lm import CausalLM, GenerationStats
from tvm_roller.integrations.llm.sampling import Sampling
from tvm_roller.integrations.llm.text import TextChunk, TextResult, TextStream, TextTokenizer
from tvm_roller.integrations.relax import compile as relax_compile
from tvm_roller.integrations.relax.passes.quantize_weights import check_target
from tvm_roller.integrations.relax.passes.schedule import relax_context
from tvm_roller.integrations.relax.passes.shape_bounds import module_bounds
from tvm_roller.planner import UNSET

__all__ = ["compile", "load", "CausalLM", "BatchGenerator", "GenerationStats", "Sampling",
           "CacheLayout",
           "TESTED_FAMILIES", "TextTokenizer", "TextStream", "TextChunk", "TextResult"]


def length_buckets(mod: tvm.IRModule, max_seq_len: int) -> Dict[str, List[int]]:
    """Bucket ends for the prompt and cache lengths: 16, 128, 1024, ... (×8) below
    ``max_seq_len``, and ``max_seq_len`` (an end within 1.5× of it is dropped: a bucket that
    short buys nothing). Each end is one more kernel for each of prefill's ~40 functions with a
    length (the default — powers of two, split further where padding costs — gives ~14).
    ``decode``'s batch (its ids' rows, when a shape variable): 1, 2, 4, ... up to its bound
    (a decode step's GEMMs read the weights once for the batch: a padded row is a tenth of a
    token's time, not a token's)."""
    ends = [16]
    while ends[-1] * 8 < max_seq_len:
        ends.append(ends[-1] * 8)
    ends = [e for e in ends if e * 1.5 <= max_seq_len] + [max_seq_len]
    bounds = module_bounds(mod)
    out = {name: ends for name, (_, hi) in sorted(bounds.items()) if hi is not None}
    rows = mod["decode"].params[0].ty.shape[0]
    if isinstance(rows, tvm.tirx.Var) and bounds.get(rows.name, (None, None))[1]:
        top = bounds[rows.name][1]
        out[rows.name] = sorted({min(1 << i, top) for i in range(top.bit_length() + 1)})
    return out


def compile(model, target=None, max_seq_len: int = 2048,  # noqa: A001
            weights: str = "fp32", device: Optional[DeviceModel] = None,
            cache=UNSET, tokenizer=None, max_batch: int = 1) -> CausalLM:
    """``model`` (a transformers ``*ForCausalLM``) compiled for generation on ``target``
    (None: this machine). ``weights``: "fp32", or "int8" / "int4": the linear layers' and
    embeddings' weights quantized in groups of 32 (the fp32 tensors are not kept; a weight a
    format cannot take stays float32, with its reason in ``report``), multiplied in integer
    dot products (``backends.cpu.quant_linear``, over the target's route: AVX-512 VNNI,
    AVX-VNNI, AVX-512BW, AVX2, AArch64 ``sdot`` or plain NEON; an x86 CPU without AVX2 is an
    ``UnsupportedError``). An architecture torch.export or the importer cannot take is an
    ``UnsupportedError`` naming the step. ``target`` may be a
    :class:`~tvm_roller.planner.Context` (its options: ``cache`` given here changes it);
    ``cache``: as in :func:`tvm_roller.relax.compile` (False: nothing read or written).
    ``tokenizer`` (a transformers tokenizer or a ``TextTokenizer``): for ``generate_text`` /
    ``stream_text``; generation ends at its eos token and the model's generation config's.
    ``max_batch``: the most sequences one ``decode`` call takes (``BatchGenerator``: continuous
    batching over a paged cache); its projections are planned for batches of 1, 2, 4, ... up
    to it."""
    if max_seq_len < 3:
        raise ValueError(f"max_seq_len must be >= 3, got {max_seq_len}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    # the one Context (the target normalised once) of both the checks and the compile
    ctx = relax_context(HOST_TARGET if target is None else target, device, cache=cache)
    fmt = None if weights == "fp32" else check_target(ctx.target, weights)
    lm = export_lm(model, max_seq_len, ctx.device, fmt, max_batch)
    report: list = list(lm.kernels)
    one_row_bounds(report, lm.mod, ctx)
    ex = relax_compile(lm.mod, ctx, report, buckets=length_buckets(lm.mod, max_seq_len))
    dev = ctx.runtime_device()
    vm = tvm.relax.VirtualMachine(ex, dev)
    # the weights as torch holds them (no copy: decode reads them in place) and prefill's
    # transposes made from them once
    raw = [tvm.runtime.tensor(w, dev) if isinstance(w, np.ndarray)  # packed: a copy, aligned
           else tvm.runtime.from_dlpack(_aligned(w.contiguous())) for w in lm.weights]
    prepared = list(vm["prefill_transform_params"](raw))
    text = None if tokenizer is None else TextTokenizer.wrap(tokenizer, _eos_ids(model))
    return CausalLM(vm, prepared, raw, lm.cache, lm.vocab, max_seq_len, dev, report,
                    tokenizer=text, max_batch=max_batch)


def load(path: Union[str, os.PathLike], max_seq_len: Optional[int] = None,
         weights: str = "fp32", target=None, cache=UNSET, max_batch: int = 1) -> CausalLM:
    """A local HuggingFace model directory (config, weights, tokenizer: nothing downloaded)
    compiled with its tokenizer, as ``compile`` does. ``max_seq_len``: the context (prompt and
    new tokens; default the model's ``max_position_embeddings``, at most 2048)."""
    import transformers

    if not os.path.isdir(path):
        raise ValueError(f"{path}: not a model directory")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    if max_seq_len is None:
        max_seq_len = min(int(getattr(model.config, "max_position_embeddings", 2048)), 2048)
    return compile(model, target, max_seq_len, weights, cache=cache, tokenizer=tokenizer,
                   max_batch=max_batch)


def _eos_ids(model) -> List[int]:
    """The model's generation config's eos ids (an int, a list or None)."""
    config = getattr(model, "generation_config", None) or getattr(model, "config", None)
    eos = getattr(config, "eos_token_id", None)
    return [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def _aligned(w):
    """``w``, or a copy of it where its data does not start on 64 bytes (TVM's tensors must):
    a model read from safetensors holds views into the mapped file at any offset (torch's own
    allocations are aligned, so they stay shared)."""
    return w if w.data_ptr() % 64 == 0 else w.clone()
