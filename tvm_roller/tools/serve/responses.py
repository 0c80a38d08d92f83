"""The OpenAI response objects: a completion or chat completion as one JSON body, or as the
chunks of a server-sent event stream. Beside OpenAI's fields each final object carries
``timings`` (the request's seconds and speeds, ``SerialWorker._timings``)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Reply:
    """One request's response, as text or as stream chunks: ``chat`` picks the chat objects."""

    model: str
    chat: bool
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.request_id}"

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: Optional[str], usage: dict,
              timings: dict) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(False), "choices": [choice], "usage": usage, "timings": timings}

    def chunk(self, text: Optional[str], finish_reason: Optional[str] = None,
              first: bool = False, timings: Optional[dict] = None) -> str:
        """An SSE event with ``text`` (chat: the first one also says the role)."""
        choice: dict = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            delta: dict = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        body = {**self._head(True), "choices": [choice]}
        if timings is not None:
            body["timings"] = timings
        return sse(body)

    def usage_chunk(self, usage: dict) -> str:
        """``stream_options.include_usage``: the last chunk, usage and no choices."""
        return sse({**self._head(True), "choices": [], "usage": usage})


def sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
