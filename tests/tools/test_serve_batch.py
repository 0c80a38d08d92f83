"""``tvm-roller serve --max-batch N``: continuous batching over the paged KV cache, through the
OpenAI client. Concurrent requests decode together and each one's greedy text equals HF's; a
finished request's blocks, and a departed client's, are back in the pool at once (read from
``/metrics``); a pool too small for the requests in flight makes them wait or be preempted and
recomputed, never fail; a fault in a step is an error for that batch, and the server goes on."""
from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
pytest.importorskip("transformers")

from make_demo_model import make_demo_model  # noqa: E402
from serving import KEY, hf_text, metric, serving  # noqa: E402
from tvm_roller.integrations import llm  # noqa: E402
from tvm_roller.tools.serve.runner import ServeConfig  # noqa: E402

MAX_SEQ = 128
MAX_BATCH = 4
FREE = "tvm_roller_kv_cache_free_blocks"
TOTAL = "tvm_roller_kv_cache_blocks"
DECODE_ROWS, DECODE_S = "tvm_roller_decode_rows_total", "tvm_roller_decode_seconds_total"


@pytest.fixture(scope="module")
def batched_lm(tmp_path_factory):
    directory = str(make_demo_model(str(tmp_path_factory.mktemp("models") / "demo")))
    return directory, llm.load(directory, max_seq_len=MAX_SEQ, max_batch=MAX_BATCH)


def _config(directory, lm, pool_blocks=None) -> ServeConfig:
    """A batching server; ``pool_blocks``: its pool as a --kv-cache-gb budget."""
    gb = None
    if pool_blocks is not None:
        per_block = lm.cache.position_bytes * lm.cache.block
        gb = (pool_blocks + 0.5) * per_block / 1e9
    return ServeConfig(directory, max_queue=16, api_key=KEY, log_level="warning",
                       max_batch=MAX_BATCH, kv_cache_gb=gb, prefill_chunk=16)


@pytest.fixture(scope="module")
def served(batched_lm):
    directory, lm = batched_lm
    with serving(_config(directory, lm), lm) as served:
        yield served


def _rows_seen(monkeypatch, lm, delay: float = 0.0) -> list:
    """Each model call's batch rows, recorded (and each call ``delay`` seconds slower)."""
    rows, real = [], lm.run

    def run(name, ids, *args):
        rows.append(ids.shape[0])
        time.sleep(delay)
        return real(name, ids, *args)
    monkeypatch.setattr(lm, "run", run)
    return rows


def _prompts(served, count: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    vocab = served.tokenizer.vocab_size
    return [rng.integers(3, vocab, int(n)).tolist() for n in rng.integers(1, 40, count)]


def _complete(served, prompt, max_tokens: int, ignore_eos: bool = True):
    return served.client().completions.create(
        model=served.name, prompt=prompt, max_tokens=max_tokens, temperature=0,
        extra_body={"ignore_eos": ignore_eos})


def test_concurrent_requests_decode_together_and_equal_hf(served, monkeypatch):
    rows = _rows_seen(monkeypatch, served.lm, delay=0.002)
    prompts = _prompts(served, 7, seed=1)
    news = [5 + 3 * i for i in range(len(prompts))]
    made, secs = metric(served, DECODE_ROWS), metric(served, DECODE_S)
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(lambda i: _complete(served, prompts[i], news[i], bool(i % 2)),
                             range(len(prompts))))
    assert max(rows) >= 2  # several sequences in one decode call
    assert max(rows) <= MAX_BATCH
    for i, out in enumerate(outs):
        assert out.choices[0].text == hf_text(served, prompts[i], news[i], bool(i % 2)), i
    assert metric(served, FREE) == metric(served, TOTAL) > 0
    # every token came from a decode step (a prompt's last position goes with the batch)
    assert metric(served, DECODE_ROWS) - made == sum(o.usage.completion_tokens for o in outs)
    assert metric(served, DECODE_S) > secs


def test_blocks_return_on_finish_and_on_disconnect(served, monkeypatch):
    _rows_seen(monkeypatch, served.lm, delay=0.05)  # 100 tokens: 5 s unless it is dropped
    total = metric(served, TOTAL)
    cancelled = metric(served, 'tvm_roller_requests_total{outcome="cancelled"}')
    stream = served.client().completions.create(
        model=served.name, prompt=list(range(3, 20)), max_tokens=100, temperature=0,
        stream=True, extra_body={"ignore_eos": True})
    read = 0
    for chunk in stream:
        read += 1
        if read == 3:
            break
    assert metric(served, FREE) < total  # the stream's blocks are taken
    stream.close()
    deadline = time.time() + 3
    while time.time() < deadline and metric(served, FREE) < total:
        time.sleep(0.02)
    assert metric(served, FREE) == total
    assert metric(served, 'tvm_roller_requests_total{outcome="cancelled"}') == cancelled + 1
    monkeypatch.undo()
    assert _complete(served, list(range(3, 40)), 8).usage.completion_tokens == 8
    assert metric(served, FREE) == total  # a finished request's blocks: back with its answer


def test_a_fault_in_a_step_is_an_error_and_the_server_goes_on(served, monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(served.lm, "run", broken)
    with pytest.raises(openai.InternalServerError):
        _complete(served, [5, 6, 7], 4)
    monkeypatch.undo()
    assert _complete(served, [5, 6, 7], 4).usage.completion_tokens == 4
    assert metric(served, FREE) == metric(served, TOTAL)


def test_an_exhausted_pool_waits_or_preempts_never_fails(batched_lm):
    """A pool of one whole context and a block: every request runs to the end of the context,
    so they wait or are preempted (recomputed); each text is HF's and every block returns."""
    directory, lm = batched_lm
    pool = lm.cache.max_blocks + 1
    with serving(_config(directory, lm, pool), lm) as served:
        assert metric(served, TOTAL) == pool
        prompts = _prompts(served, 6, seed=2)
        news = [MAX_SEQ - len(p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
            outs = list(ex.map(lambda i: _complete(served, prompts[i], news[i]),
                               range(len(prompts))))
        for i, out in enumerate(outs):
            assert out.usage.completion_tokens == news[i]
            assert out.choices[0].text == hf_text(served, prompts[i], news[i], True), i
        assert metric(served, FREE) == pool
        assert metric(served, 'tvm_roller_requests_total{outcome="error"}') == 0
        if lm.cache.block < MAX_SEQ // 2:
            assert metric(served, "tvm_roller_preemptions_total") > 0
