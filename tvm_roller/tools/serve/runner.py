"""What ``tvm-roller serve`` runs: the model directory compiled (or loaded from the module
cache) before the server listens, then the app under uvicorn until it is stopped."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Optional

from tvm_roller.tools.serve.app import create_app
from tvm_roller.tools.serve.engine import Engine
from tvm_roller.tools.serve.worker import SerialWorker

log = logging.getLogger("tvm_roller.serve")


@dataclass
class ServeConfig:
    """``model``: a local HuggingFace directory (weights and tokenizer). ``max_queue``:
    requests that may wait beside the one generating (one more is a 429). ``api_key``:
    required as a bearer token on ``/v1`` when set. ``model_name``: the id clients send
    (default: the directory's name; its path as given is accepted too)."""

    model: str
    weights: str = "fp32"
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = 32
    api_key: Optional[str] = None
    max_seq_len: Optional[int] = None
    model_name: Optional[str] = None
    cache: bool = True
    log_level: str = "info"

    @property
    def name(self) -> str:
        return self.model_name or os.path.basename(os.path.normpath(self.model))


def load_model(config: ServeConfig):
    """The compiled ``CausalLM`` with its tokenizer (``tvm_roller.llm.load``)."""
    from tvm_roller.integrations import llm

    return llm.load(config.model, max_seq_len=config.max_seq_len, weights=config.weights,
                    cache=config.cache)


def build_server(config: ServeConfig, lm):
    """A ``uvicorn.Server`` for ``lm`` (its engine and worker start with the app);
    ``server.run()`` serves, ``server.run(sockets=[...])`` on sockets already bound."""
    import uvicorn

    engine = Engine(config.max_queue)
    app = create_app(engine, lm, config.name, config.api_key, SerialWorker(engine, lm),
                     aliases=(config.model,))
    uv = uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                        timeout_graceful_shutdown=30)
    return uvicorn.Server(uv)


def serve(config: ServeConfig) -> int:
    """Compile, then serve until stopped (Ctrl-C, or SIGTERM: the running request finishes,
    the waiting ones get an error event)."""
    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s: %(message)s")
    t0 = time.perf_counter()
    lm = load_model(config)
    print(f"{config.name}: compiled in {time.perf_counter() - t0:.1f} s (weights "
          f"{config.weights}, context {lm.max_seq_len}); serving http://{config.host}:"
          f"{config.port}/v1", flush=True)
    try:
        build_server(config, lm).run()
    except KeyboardInterrupt:  # uvicorn shut down gracefully, then passes Ctrl-C on
        pass
    return 0
