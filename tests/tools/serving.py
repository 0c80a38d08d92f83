"""The serve tests' server: a ``build_server`` under uvicorn in a thread on a free localhost
port, with the HF model on the same directory as the reference, and its metrics read back."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import torch
import transformers

from tvm_roller.tools.serve.runner import ServeConfig, build_server

KEY = "test-key"


@dataclass
class Served:
    url: str
    name: str
    lm: Any  # the server's CausalLM (the tests slow it down or break it for a while)
    model: Any  # HF's model on the same directory: the reference
    tokenizer: Any
    directory: str

    def client(self, **kw) -> "openai.OpenAI":
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", KEY),
                             max_retries=0, timeout=60, **kw)


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serving(config: ServeConfig, lm):
    """``lm`` served as ``config`` asks, until the block ends."""
    server = build_server(config, lm)
    sock = free_socket()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started and thread.is_alive() and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    model = transformers.AutoModelForCausalLM.from_pretrained(config.model).eval()
    tok = transformers.AutoTokenizer.from_pretrained(config.model)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", config.name, lm, model, tok,
                     config.model)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def hf_text(served: Served, ids, max_new_tokens: int, ignore_eos: bool = False) -> str:
    """HF's greedy generation (stopping at the generation config's eos ids unless
    ``ignore_eos``), decoded."""
    ids = torch.tensor([ids])
    least = max_new_tokens if ignore_eos else 0
    with torch.no_grad():
        out = served.model.generate(ids, attention_mask=torch.ones_like(ids),
                                    max_new_tokens=max_new_tokens, min_new_tokens=least,
                                    do_sample=False)
    return served.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def metric(served: Served, name: str) -> float:
    for line in httpx.get(served.url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)
