"""``CausalLM``: generation with a compiled ``prefill`` / ``decode`` pair (``compile``)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np
import tvm

from tvm_roller.backends.cpu.kv_cache import CacheLayout
from tvm_roller.integrations.llm.sampling import Sampling, TokenPicker
from tvm_roller.integrations.llm.text import Prompt, TextResult, TextStream, TextTokenizer


@dataclass
class GenerationStats:
    """The last call's prefill and decode seconds and token counts."""

    prefill_s: float = 0.0
    prefill_tokens: int = 0
    decode_s: float = 0.0
    decode_tokens: int = 0

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s else 0.0


@dataclass
class CausalLM:
    """A compiled causal LM: ``generate`` (a ``[1, n + k]`` tensor) and ``stream`` (token ids as
    they come); with a ``tokenizer``, ``generate_text`` and ``stream_text``. ``report``: one
    entry per PrimFunc of both functions (``relax.compile``'s)."""

    vm: tvm.relax.VirtualMachine
    weights: List[tvm.runtime.Tensor]  # prefill's (its transposes)
    decode_weights: List[tvm.runtime.Tensor]  # the model's own tensors, shared with torch
    cache: CacheLayout
    vocab: int
    max_seq_len: int
    device: tvm.runtime.Device  # where the VM runs (the target's device)
    report: list = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)
    tokenizer: Optional[TextTokenizer] = None
    max_batch: int = 1  # the most sequences one ``decode`` call takes (``BatchGenerator``)
    _buffers: Optional[tuple] = field(default=None, repr=False)

    def buffers(self) -> tuple:
        """The key and value caches: a pool of the blocks of ``max_seq_len`` positions (zeroed
        once: positions past the live length inside an attention block are read and masked,
        so they must hold finite values), and the one sequence's block table (block ``i``
        holds its positions ``[i * block, (i + 1) * block)``)."""
        if self._buffers is None:
            dev, pool = self.device, self.cache.max_blocks
            table = np.arange(pool, dtype="int32")[None, :]
            self._buffers = (new_cache(self.cache, pool, dev)
                             + (tvm.runtime.tensor(table, dev),))
        return self._buffers

    def args(self, name: str, ids: np.ndarray, positions: np.ndarray, tables, lengths,
             keys, values) -> tuple:
        """The VM arguments of one ``prefill`` or ``decode`` call: ``ids`` and ``positions``
        ``[batch, m]``, each row's block ``tables`` and live ``lengths``, the caches."""
        weights = self.decode_weights if name == "decode" else self.weights
        dev = self.device
        return (tvm.runtime.tensor(ids, dev), tvm.runtime.tensor(positions, dev), tables,
                tvm.runtime.tensor(lengths, dev), keys, values, *weights)

    def run(self, name: str, *args):
        """One call of ``prefill`` or ``decode`` (``args`` as ``args``'s): the logits, the
        caches updated in place."""
        return self.vm[name](*self.args(name, *args))[0]

    def sequence_args(self, name: str, ids: np.ndarray, length: int) -> tuple:
        """The VM arguments for ``ids`` ([1, m]) as the positions ending at ``length`` of the
        one sequence ``buffers`` holds."""
        keys, values, table = self.buffers()
        m = ids.shape[1]
        used = table._create_view((1, -(-length // self.cache.block)))
        positions = np.arange(length - m, length, dtype="int64")[None, :]
        return self.args(name, ids, positions, used, np.array([length], "int32"), keys, values)

    def _call(self, name: str, ids: np.ndarray, length: int):
        return self.vm[name](*self.sequence_args(name, ids, length))[0]

    def generate(self, input_ids, max_new_tokens: int = 20,
                 eos_token_id: Union[None, int, Sequence[int]] = None, *,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int = 50,
                 top_p: float = 1.0, seed: Optional[int] = None):
        """``input_ids`` (a torch LongTensor ``[1, n]``) followed by up to ``max_new_tokens``
        tokens (a ``[1, n + k]`` LongTensor): greedy unless ``do_sample``; it stops after an
        ``eos_token_id`` (an int or a list) when one is given."""
        import torch

        new = list(self.stream(input_ids, max_new_tokens, eos_token_id, do_sample=do_sample,
                               temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))
        tail = torch.tensor([new], dtype=input_ids.dtype).reshape(1, len(new))
        return torch.cat([input_ids, tail], dim=1)

    def stream(self, input_ids, max_new_tokens: int = 20,
               eos_token_id: Union[None, int, Sequence[int]] = None, *,
               do_sample: bool = False, temperature: float = 1.0, top_k: int = 50,
               top_p: float = 1.0, seed: Optional[int] = None,
               min_new_tokens: int = 0) -> Iterator[int]:
        """The new token ids one by one, as ``generate`` makes them (a generator: ``close()``
        stops it before the next step). ``min_new_tokens``: no ``eos_token_id`` is picked
        before that many tokens (HF's ``min_new_tokens``)."""
        prompt = self._prompt(input_ids, max_new_tokens)
        pick = TokenPicker(Sampling(do_sample, temperature, top_k, top_p, seed))
        stops = _stop_set(eos_token_id)
        self.stats = GenerationStats()
        return self._tokens(prompt, max_new_tokens, pick, stops, max(0, min_new_tokens))

    def stream_text(self, prompt: Prompt, max_tokens: int = 16, *, stop: Sequence[str] = (),
                    ignore_eos: bool = False, min_tokens: int = 0,
                    **sampling) -> TextStream:
        """Text as it is generated (needs ``tokenizer``): ``prompt`` is text, chat messages
        (``[{"role", "content"}]``, through the chat template) or token ids; up to
        ``max_tokens`` tokens, ending at an eos token (none with ``ignore_eos``; none before
        ``min_tokens``) or before the first of the ``stop`` strings. ``sampling``: as
        ``stream``'s (greedy by default). A ``TextStream`` of ``TextChunk``s."""
        if self.tokenizer is None:
            raise ValueError("no tokenizer: compile with tokenizer=..., or llm.load(directory)")
        ids = self.tokenizer.prompt_ids(prompt)
        eos = frozenset() if ignore_eos else self.tokenizer.eos_token_ids
        tokens = self.stream(np.array([ids], dtype="int64"), max_tokens, sorted(eos),
                             min_new_tokens=min_tokens, **sampling)
        return TextStream(tokens, self.tokenizer, len(ids), max_tokens, stop, eos, min_tokens,
                          self.stats)

    def generate_text(self, prompt: Prompt, max_tokens: int = 16, **options) -> TextResult:
        """``stream_text``'s whole generation: the text, the token ids, why it ended, timings."""
        return self.stream_text(prompt, max_tokens, **options).result()

    def logits(self, input_ids) -> np.ndarray:
        """Teacher-forced next-token logits at every position of ``input_ids`` (``[1, n]``), as
        an ``[n, vocab]`` float32 array: position ``i`` is a decode step over positions
        ``[0, i]`` (accuracy and perplexity evaluation)."""
        prompt = self._prompt(input_ids, 0)
        out = np.empty((prompt.shape[1], self.vocab), dtype="float32")
        for i in range(prompt.shape[1]):
            out[i] = self._decode(prompt[:, i:i + 1], i + 1).numpy()[0]
        return out

    def _decode(self, ids: np.ndarray, length: int):
        """One decode step: the logits after ``ids`` ([1, 1]), the cache's live length
        ``length`` with it."""
        return self._call("decode", ids, length)

    def _tokens(self, prompt: np.ndarray, max_new_tokens: int, pick: TokenPicker,
                stops: set, min_new: int = 0) -> Iterator[int]:
        if max_new_tokens == 0:
            return
        banned = sorted(stops)  # eos may not be picked while fewer than min_new tokens came
        t0 = time.perf_counter()
        # one position: a decode step from an empty cache
        logits = self._call("decode" if prompt.shape[1] == 1 else "prefill", prompt,
                            prompt.shape[1])
        token = pick(logits.numpy(), banned if min_new > 0 else ())
        self.stats.prefill_s, self.stats.prefill_tokens = time.perf_counter() - t0, prompt.shape[1]
        yield token
        for new, length in enumerate(range(prompt.shape[1] + 1,
                                           prompt.shape[1] + max_new_tokens), start=1):
            if token in stops:
                return
            t0 = time.perf_counter()
            logits = self._decode(np.array([[token]], dtype="int64"), length)
            token = pick(logits.numpy(), banned if new < min_new else ())
            self.stats.decode_s += time.perf_counter() - t0
            self.stats.decode_tokens += 1
            yield token

    def _prompt(self, input_ids, max_new_tokens: int) -> np.ndarray:
        prompt = np.asarray(input_ids.cpu().numpy() if hasattr(input_ids, "cpu") else input_ids)
        if prompt.ndim != 2 or prompt.shape[0] != 1:
            raise ValueError(f"input_ids must be [1, n] (batch 1), got shape {prompt.shape}")
        if prompt.shape[1] < 1:
            raise ValueError("the prompt must hold at least 1 token")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if prompt.shape[1] + max_new_tokens > self.max_seq_len:
            raise ValueError(f"prompt ({prompt.shape[1]}) + max_new_tokens ({max_new_tokens}) "
                             f"exceeds max_seq_len ({self.max_seq_len})")
        if prompt.min() < 0 or prompt.max() >= self.vocab:
            raise ValueError(f"token ids must be in [0, {self.vocab})")
        return prompt.astype("int64")


def new_cache(layout: CacheLayout, pool: int, dev) -> tuple:
    """Zeroed keys and values for a pool of ``pool`` blocks on ``dev``."""
    return (tvm.runtime.tensor(np.zeros(layout.key_shape(pool), "float32"), dev),
            tvm.runtime.tensor(np.zeros(layout.value_shape(pool), "float32"), dev))


def _stop_set(eos_token_id) -> set:
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, (int, np.integer)) \
        else {int(t) for t in eos_token_id}
