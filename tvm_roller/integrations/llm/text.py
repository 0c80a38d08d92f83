"""Text in, text out: the model directory's tokenizer (``transformers.AutoTokenizer``) and chat
template, and ``TextStream``: a token stream turned into text deltas that stops on an eos token,
on a stop string or at ``max_tokens`` (``CausalLM.stream_text`` / ``generate_text``)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Union

from tvm_roller.integrations.llm.detokenize import Detokenizer, StopStrings

# a prompt: text (the tokenizer adds its bos), chat messages (the chat template renders them),
# or token ids as they are
Prompt = Union[str, Sequence[dict], Sequence[int]]


@dataclass(frozen=True)
class TextTokenizer:
    """A HuggingFace tokenizer and the ids that end generation: its eos token and the model's
    generation config's (a chat model often ends a turn with a second one)."""

    hf: Any  # transformers.PreTrainedTokenizerBase
    eos_token_ids: FrozenSet[int] = frozenset()

    @classmethod
    def from_pretrained(cls, path: Union[str, os.PathLike],
                        eos_token_ids: Iterable[int] = ()) -> "TextTokenizer":
        """The tokenizer of a local model directory (HF's files: tokenizer.json,
        tokenizer_config.json with its chat template)."""
        import transformers

        return cls.wrap(transformers.AutoTokenizer.from_pretrained(str(path)), eos_token_ids)

    @classmethod
    def wrap(cls, hf, eos_token_ids: Iterable[int] = ()) -> "TextTokenizer":
        if isinstance(hf, TextTokenizer):
            return hf
        eos = set(_ids(eos_token_ids))
        if hf.eos_token_id is not None:
            eos.add(int(hf.eos_token_id))
        return cls(hf, frozenset(eos))

    def encode(self, text: str) -> List[int]:
        """Text as the tokenizer encodes it, with its special tokens (a bos for most)."""
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

    def chat(self, messages: Sequence[dict]) -> List[int]:
        """``messages`` (``{"role", "content"}`` dicts) through the tokenizer's chat template,
        with the prompt for the assistant's turn (the template writes the special tokens)."""
        if getattr(self.hf, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template (tokenizer_config.json's "
                             "chat_template): send a plain prompt")
        text = self.hf.apply_chat_template(list(messages), tokenize=False,
                                           add_generation_prompt=True)
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True) if len(ids) else ""

    def prompt_ids(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self.encode(prompt)
        items = list(prompt)
        if items and all(isinstance(m, dict) for m in items):
            return self.chat(items)
        return _ids(items)


@dataclass
class TextChunk:
    """One generated token and the text it completed (often "" inside a UTF-8 character or a
    possible stop string). ``finish_reason``: None, then "stop" (eos or a stop string) or
    "length" (``max_tokens``) on the last chunk."""

    text: str
    token_id: int
    finish_reason: Optional[str] = None


@dataclass
class TextResult:
    """A whole generation: the text (cut before a stop string), the token ids generated (an
    eos included), why it ended, and the call's timings (``TextStream.timings``)."""

    text: str
    token_ids: List[int]
    finish_reason: str
    prompt_tokens: int
    timings: Dict[str, float] = field(default_factory=dict)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


class TextStream:
    """``TextChunk`` after ``TextChunk``, one per token; ``close()`` stops the generation
    (the next token is never computed). ``text``, ``token_ids``, ``finish_reason`` hold what
    came so far."""

    def __init__(self, tokens: Iterator[int], tokenizer: TextTokenizer, prompt_tokens: int,
                 max_tokens: int, stop: Sequence[str] = (), eos: FrozenSet[int] = frozenset(),
                 min_tokens: int = 0, stats=None):
        self._tokens, self._tokenizer, self._stats = tokens, tokenizer, stats
        self._detok = Detokenizer(tokenizer.decode)
        self._stops = StopStrings(stop)
        self._eos, self._max, self._min = eos, max_tokens, min_tokens
        self.prompt_tokens = prompt_tokens
        self.text = ""
        self.token_ids: List[int] = []
        self.finish_reason: Optional[str] = None
        self._t0 = time.perf_counter()
        self._times: List[float] = []  # when each token came

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> TextChunk:
        if self.finish_reason is not None:
            raise StopIteration
        try:
            token = int(next(self._tokens))
        except StopIteration:  # the token stream ended on its own: its length was reached
            return self._end("length", "", -1)
        self._times.append(time.perf_counter())
        self.token_ids.append(token)
        if token in self._eos:  # its text (a special token's) is not part of the answer
            return self._end("stop", "", token)
        emit, stopped = self._stops.feed(self._detok.push(token),
                                          match=len(self.token_ids) >= self._min)
        if stopped:
            return self._end("stop", emit, token, cut=True)
        if len(self.token_ids) >= self._max:
            return self._end("length", emit, token)
        self.text += emit
        return TextChunk(emit, token)

    def _end(self, reason: str, emit: str, token: int, cut: bool = False) -> TextChunk:
        """The last chunk: the text held back (an unfinished character, a stop string's
        possible start) is released, unless a stop string cut the text."""
        if not cut:
            tail, cut = self._stops.feed(self._detok.flush())
            emit += tail if cut else tail + self._stops.flush()
        self.finish_reason = "stop" if cut else reason
        self.close()
        self.text += emit
        return TextChunk(emit, token, self.finish_reason)

    def close(self) -> None:
        """Stop generating (a generator's ``close``: the model runs no further step)."""
        close = getattr(self._tokens, "close", None)
        if close is not None:
            close()

    def result(self) -> TextResult:
        """The rest of the generation, and all of it as one ``TextResult``."""
        for _ in self:
            pass
        return TextResult(self.text, list(self.token_ids), self.finish_reason or "length",
                          self.prompt_tokens, self.timings())

    def timings(self) -> Dict[str, float]:
        """Seconds from the call to the first token (prefill), the whole call and the mean gap
        between tokens; the model's own prefill / decode seconds and tokens per second."""
        t = self._times
        out = {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.token_ids),
               "first_token_s": t[0] - self._t0 if t else 0.0,
               "total_s": (t[-1] if t else time.perf_counter()) - self._t0,
               "inter_token_s": (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else 0.0}
        s = self._stats
        if s is not None:
            out.update(prefill_s=s.prefill_s, decode_s=s.decode_s,
                       prefill_tok_s=s.prefill_tok_s, decode_tok_s=s.decode_tok_s)
        return out


def _ids(values: Iterable) -> List[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
            raise ValueError(f"a prompt of token ids holds integers, got {v!r}")
        out.append(int(v))
    return out
