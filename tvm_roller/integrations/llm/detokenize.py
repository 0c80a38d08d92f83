"""Token ids to text as they come: an incremental detokenizer that never splits a UTF-8
character, and stop strings cut out of the text with no stop string's start ever emitted."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

REPLACEMENT = "\ufffd"  # what a decoder writes for the bytes of an unfinished UTF-8 character


class Detokenizer:
    """``push(token)`` returns the text the token completes ("" while it ends inside a UTF-8
    character). The deltas joined equal ``decode(all tokens)``: each decode starts at a
    boundary where the text decoded so far ended on a whole character, so the text before it
    cannot change (and a tokenizer that drops a leading space keeps the context it needs)."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self.ids: List[int] = []
        self._prefix = 0  # ids[_prefix:_read] decoded: the context of the next delta
        self._read = 0  # ids before it are emitted

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        text = self._decode(self.ids[self._prefix:])
        if len(text) > len(prefix_text) and not text.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self.ids)
            return text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """The text held back at the end (bytes that never finished a character decode to
        U+FFFD, as a full decode writes them)."""
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        text = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return text[len(prefix_text):]


class StopStrings:
    """Cuts text at the first of ``stops``: ``feed(delta)`` returns ``(text to emit, stopped)``.
    Text that could be the start of a stop string is held until the next delta decides."""

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self._held = ""

    def feed(self, delta: str, match: bool = True) -> Tuple[str, bool]:
        """``match=False`` (before ``min_tokens``): the text passes, nothing matches or is held."""
        text, self._held = self._held + delta, ""
        if not self.stops or not match:
            return text, False
        cut = _first_match(text, self.stops)
        if cut is not None:
            return text[:cut], True
        hold = max(_overlap(text, s) for s in self.stops)
        if hold:
            text, self._held = text[:-hold], text[-hold:]
        return text, False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def _first_match(text: str, stops: Sequence[str]) -> Optional[int]:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _overlap(text: str, stop: str) -> int:
    """The length of the longest end of ``text`` that starts ``stop`` (shorter than ``stop``)."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0
