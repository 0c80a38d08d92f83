"""What ``tvm-roller serve`` runs: the model directory compiled (or loaded from the module
cache) before the server listens, then the app under uvicorn until it is stopped."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Optional

from tvm_roller.integrations.llm.batch import BatchGenerator
from tvm_roller.tools.serve.app import create_app
from tvm_roller.tools.serve.batch_worker import BatchWorker
from tvm_roller.tools.serve.engine import Engine
from tvm_roller.tools.serve.worker import SerialWorker

log = logging.getLogger("tvm_roller.serve")


@dataclass
class ServeConfig:
    """``model``: a local HuggingFace directory (weights and tokenizer). ``max_queue``:
    requests that may wait beside the one generating (one more is a 429). ``api_key``:
    required as a bearer token on ``/v1`` when set. ``model_name``: the id clients send
    (default: the directory's name; its path as given is accepted too). ``max_batch`` > 1:
    continuous batching (``BatchWorker``) of up to that many sequences over a paged KV cache
    of ``kv_cache_gb`` (default: room for ``max_batch`` whole contexts), prompts prefilled
    ``prefill_chunk`` positions a step; 1: one sequence at a time (``SerialWorker``)."""

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
    max_batch: int = 1
    kv_cache_gb: Optional[float] = None
    prefill_chunk: int = 128

    @property
    def name(self) -> str:
        return self.model_name or os.path.basename(os.path.normpath(self.model))


def load_model(config: ServeConfig):
    """The compiled ``CausalLM`` with its tokenizer (``tvm_roller.llm.load``)."""
    from tvm_roller.integrations import llm

    return llm.load(config.model, max_seq_len=config.max_seq_len, weights=config.weights,
                    cache=config.cache, max_batch=config.max_batch)


def make_worker(config: ServeConfig, engine: Engine, lm):
    """The engine loop ``config`` asks for: serial, or batching over a pool of
    ``--kv-cache-gb`` (a budget that cannot hold one whole context is a ValueError)."""
    if config.max_batch <= 1:
        return SerialWorker(engine, lm)
    if config.kv_cache_gb is None:
        blocks = config.max_batch * lm.cache.max_blocks
    else:
        blocks = BatchGenerator.pool_blocks_for(lm, int(config.kv_cache_gb * 1e9))
    return BatchWorker(engine, lm, blocks, config.max_batch, config.prefill_chunk)


def build_server(config: ServeConfig, lm):
    """A ``uvicorn.Server`` for ``lm`` (its engine and worker start with the app);
    ``server.run()`` serves, ``server.run(sockets=[...])`` on sockets already bound."""
    import uvicorn

    engine = Engine(config.max_queue)
    app = create_app(engine, lm, config.name, config.api_key,
                     make_worker(config, engine, lm), aliases=(config.model,))
    uv = uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                        timeout_graceful_shutdown=30)
    return uvicorn.Server(uv)


def serve(config: ServeConfig) -> int:
    """Compile, then serve until stopped (Ctrl-C, or SIGTERM: the running request finishes,
    the waiting ones get an error event)."""
    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s: %(message)s")
    t0 = time.perf_counter()
    lm = load_model(config)
    server = build_server(config, lm)
    print(f"{config.name}: compiled in {time.perf_counter() - t0:.1f} s (weights "
          f"{config.weights}, context {lm.max_seq_len}, batch {config.max_batch}); serving "
          f"http://{config.host}:{config.port}/v1", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shut down gracefully, then passes Ctrl-C on
        pass
    return 0
