"""``tvm-roller serve``: an OpenAI-compatible server over the demo model directory
(``python/make_demo_model.py``: nothing downloaded), started on a free localhost port and
driven by the official ``openai`` client. Greedy text equals HF's ``generate`` + decode on the
same directory; chat goes through the template; a stream's text equals the whole reply's; bad
input is a 4xx and the server answers afterwards; a client that leaves frees the engine at
the next token; past ``--max-queue`` a request gets a 429."""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
transformers = pytest.importorskip("transformers")

from conftest import REPO_ROOT  # noqa: E402
from make_demo_model import make_demo_model  # noqa: E402
from serving import KEY, free_socket, hf_text, metric, serving  # noqa: E402
from tvm_roller.integrations import llm  # noqa: E402
from tvm_roller.tools.serve.runner import ServeConfig  # noqa: E402

MAX_SEQ = 128
MAX_QUEUE = 2
PROMPTS = ["Hello café 日本語", "The tensor kernel", "Ωμέγα 😀 cache"]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> str:
    return str(make_demo_model(str(tmp_path_factory.mktemp("models") / "demo")))


@pytest.fixture(scope="module")
def served(demo_dir):
    """One compile, one uvicorn in a thread on a free port, shut down at the end."""
    lm = llm.load(demo_dir, max_seq_len=MAX_SEQ)
    config = ServeConfig(demo_dir, max_queue=MAX_QUEUE, api_key=KEY, log_level="warning")
    with serving(config, lm) as served:
        yield served


def _slowed(lm, delay: float):
    """``lm.stream`` with ``delay`` seconds before each token: a model slow enough for a
    client to leave, or for requests to queue, mid-generation."""
    real = lm.stream

    def stream(*args, **kw):
        tokens = real(*args, **kw)

        def slow():
            try:
                for t in tokens:
                    time.sleep(delay)
                    yield t
            finally:
                tokens.close()
        return slow()
    return stream


# -- text equals the reference ------------------------------------------------------------------
def test_models_and_health(served):
    assert [m.id for m in served.client().models.list().data] == [served.name]
    health = httpx.get(served.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completion_equals_hf_generate(served, prompt):
    ids = served.tokenizer(prompt)["input_ids"]
    ref = hf_text(served, ids, 24)
    out = served.client().completions.create(model=served.name, prompt=prompt, max_tokens=24,
                                             temperature=0)
    assert out.choices[0].text == ref
    assert out.usage.prompt_tokens == len(ids) and 1 <= out.usage.completion_tokens <= 24
    assert out.choices[0].finish_reason in ("stop", "length")
    # the same prompt as token ids
    by_ids = served.client().completions.create(model=served.name, prompt=ids, max_tokens=24,
                                                temperature=0)
    assert by_ids.choices[0].text == ref


def test_chat_uses_the_template(served):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello café, what is a tile?"}]
    ids = served.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                               return_dict=False)
    assert served.tokenizer.convert_tokens_to_ids("<|assistant|>") in ids
    out = served.client().chat.completions.create(model=served.name, messages=messages,
                                                  max_tokens=20, temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == hf_text(served, ids, 20)
    assert out.usage.prompt_tokens == len(ids)


def test_library_text_api_equals_hf(served):
    lm = served.lm
    ids = served.tokenizer(PROMPTS[0])["input_ids"]
    result = lm.generate_text(PROMPTS[0], 24)
    assert result.text == hf_text(served, ids, 24) and result.prompt_tokens == len(ids)
    assert "".join(c.text for c in lm.stream_text(PROMPTS[0], 24)) == result.text
    forced = lm.generate_text(PROMPTS[0], 30, ignore_eos=True)
    assert forced.completion_tokens == 30 and forced.finish_reason == "length"
    # stop strings cut the text before the first one
    stop = forced.text[5:8]
    cut = lm.generate_text(PROMPTS[0], 30, ignore_eos=True, stop=[stop])
    assert cut.text == forced.text[:forced.text.index(stop)] and cut.finish_reason == "stop"


# -- streaming ------------------------------------------------------------------------------------
def _streamed(stream) -> tuple:
    text, finish, usage, timings = [], None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            text.append(piece or "")
            finish = choice.finish_reason or finish
        timings = getattr(chunk, "timings", None) or timings
    return "".join(text), finish, usage, timings


def test_streamed_text_equals_whole_text(served):
    client = served.client()
    kw = dict(model=served.name, max_tokens=48, temperature=0.9, top_p=0.95, seed=7,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(prompt=PROMPTS[1], **kw)
    text, finish, usage, timings = _streamed(client.completions.create(
        prompt=PROMPTS[1], stream=True, stream_options={"include_usage": True}, **kw))
    assert text == whole.choices[0].text and finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens == 48
    assert timings["ttft_s"] > 0 and timings["decode_tok_s"] > 0
    # a different seed, a different text (sampling is on)
    other = client.completions.create(prompt=PROMPTS[1], **dict(kw, seed=8))
    assert other.choices[0].text != whole.choices[0].text

    messages = [{"role": "user", "content": PROMPTS[2]}]
    chat = client.chat.completions.create(messages=messages, **kw)
    text, finish, _, _ = _streamed(client.chat.completions.create(messages=messages,
                                                                  stream=True, **kw))
    assert text == chat.choices[0].message.content and finish == chat.choices[0].finish_reason


def test_stop_strings_and_min_tokens(served):
    client = served.client()
    kw = dict(model=served.name, prompt=PROMPTS[0], max_tokens=30, temperature=0)
    full = client.completions.create(extra_body={"ignore_eos": True}, **kw).choices[0].text
    stop = full[6:9]
    cut = client.completions.create(stop=[stop, "\x00never"], extra_body={"ignore_eos": True},
                                    **kw)
    assert cut.choices[0].text == full[:full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    longer = client.completions.create(extra_body={"min_tokens": 30}, **kw)
    assert longer.usage.completion_tokens == 30 and longer.choices[0].finish_reason == "length"


# -- bad input, overload, faults ------------------------------------------------------------------
BAD_BODIES = [
    ("malformed", b'{"model": "demo", "prompt": "hi",'),
    ("not an object", b'["hi"]'),
    ("no prompt", {"model": "demo", "max_tokens": 3}),
    ("prompt type", {"model": "demo", "prompt": 5}),
    ("max_tokens type", {"model": "demo", "prompt": "hi", "max_tokens": "ten"}),
    ("max_tokens < 1", {"model": "demo", "prompt": "hi", "max_tokens": 0}),
    ("negative temperature", {"model": "demo", "prompt": "hi", "temperature": -0.5}),
    ("top_p", {"model": "demo", "prompt": "hi", "top_p": 0}),
    ("stream type", {"model": "demo", "prompt": "hi", "stream": "yes"}),
    ("prompt past the context", {"model": "demo", "prompt": "tile " * 200}),
    ("prompt + max_tokens past the context", {"model": "demo", "prompt": "hi",
                                              "max_tokens": MAX_SEQ}),
    ("token id past the vocabulary", {"model": "demo", "prompt": [1, 10 ** 6]}),
    ("two sequences", {"model": "demo", "prompt": "hi", "n": 2}),
    ("min_tokens > max_tokens", {"model": "demo", "prompt": "hi", "max_tokens": 2,
                                 "min_tokens": 3}),
    ("empty prompt ids", {"model": "demo", "prompt": []}),
    ("unknown model", {"model": "gpt-9", "prompt": "hi"}),
]


@pytest.mark.parametrize("why,body", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_input_is_a_4xx_with_an_openai_error(served, why, body):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    res = httpx.post(served.url + "/v1/completions", content=raw,
                     headers={"Authorization": f"Bearer {KEY}",
                              "Content-Type": "application/json"})
    expected = 404 if why == "unknown model" else 400
    assert res.status_code == expected, res.text
    error = res.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if why == "prompt past the context" or why.startswith("prompt + max_tokens"):
        assert error["code"] == "context_length_exceeded"
    # the server still answers
    ok = served.client().completions.create(model=served.name, prompt="hi", max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_bad_chat_input_through_the_client(served):
    client = served.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=served.name, max_tokens=0,
                                       messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=served.name, messages=[])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=served.name, temperature=-1,
                                       messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=served.name,
                                       messages=[{"role": "wizard", "content": "hi"}])


def test_api_key_is_required(served):
    with pytest.raises(openai.AuthenticationError):
        served.client(api_key="wrong").models.list()
    assert httpx.get(served.url + "/v1/models").status_code == 401
    assert httpx.get(served.url + "/health").status_code == 200  # probes need no key


def test_a_client_that_leaves_frees_the_engine_at_the_next_token(served, monkeypatch):
    delay = 0.1  # 100 tokens: 10 s unless the engine stops
    monkeypatch.setattr(served.lm, "stream", _slowed(served.lm, delay))
    client = served.client()
    cancelled = metric(served, 'tvm_roller_requests_total{outcome="cancelled"}')
    before = metric(served, "tvm_roller_generated_tokens_total")
    stream = client.completions.create(model=served.name, prompt=PROMPTS[0], max_tokens=100,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    read = 0
    for chunk in stream:
        read += bool(chunk.choices and chunk.choices[0].text)
        if read == 3:
            break
    stream.close()
    left = time.perf_counter()
    out = client.completions.create(model=served.name, prompt="hi", max_tokens=2,
                                    temperature=0, extra_body={"ignore_eos": True})
    waited = time.perf_counter() - left
    assert out.usage.completion_tokens == 2
    # the next request waited for the token in flight and its own 2 tokens (margin for a
    # loaded machine), not for the 90-odd tokens left
    assert waited < 20 * delay, waited
    assert metric(served, 'tvm_roller_requests_total{outcome="cancelled"}') == cancelled + 1
    generated = metric(served, "tvm_roller_generated_tokens_total") - before - 2
    assert generated < 12, generated  # the tokens read, the ones held as "", one more


def test_past_max_queue_requests_get_429(served, monkeypatch):
    monkeypatch.setattr(served.lm, "stream", _slowed(served.lm, 0.1))  # 1 s a request
    client = served.client()
    n = MAX_QUEUE + 4

    def one(_):
        try:
            out = client.completions.create(model=served.name, prompt="hi", max_tokens=10,
                                            temperature=0, extra_body={"ignore_eos": True})
            return out.usage.completion_tokens
        except openai.RateLimitError as e:
            assert e.status_code == 429 and e.body["code"] == "queue_full"
            return 429

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    done = [r for r in results if r == 10]
    assert results.count(429) >= n - MAX_QUEUE - 1 and len(done) >= MAX_QUEUE
    assert len(done) + results.count(429) == n  # every request answered
    monkeypatch.undo()
    out = client.completions.create(model=served.name, prompt="hi", max_tokens=2)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert metric(served, 'tvm_roller_requests_total{outcome="rejected"}') >= n - MAX_QUEUE - 1


def test_a_fault_in_generation_is_an_error_not_a_hang(served, monkeypatch):
    def broken(*args, **kw):
        def tokens():
            yield 5
            raise RuntimeError("injected fault")
        return tokens()

    monkeypatch.setattr(served.lm, "stream", broken)
    client = served.client()
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=served.name, prompt="hi", max_tokens=4)
    with pytest.raises(openai.APIError, match="injected fault"):
        _streamed(client.completions.create(model=served.name, prompt="hi", max_tokens=4,
                                            stream=True))
    monkeypatch.undo()
    assert client.completions.create(model=served.name, prompt="hi", max_tokens=2).usage


def test_metrics_and_timings(served):
    res = httpx.post(served.url + "/v1/completions", json={
        "model": served.name, "prompt": "hi", "max_tokens": 4, "temperature": 0},
        headers={"Authorization": f"Bearer {KEY}"})
    timings = res.json()["timings"]
    assert {"queue_s", "ttft_s", "total_s", "generation_s", "prefill_s", "decode_s",
            "decode_tok_s"} <= set(timings)
    assert 0 <= timings["queue_s"] <= timings["ttft_s"] <= timings["total_s"]
    text = httpx.get(served.url + "/metrics").text
    for name in ("tvm_roller_queue_depth", "tvm_roller_time_to_first_token_seconds_bucket",
                 "tvm_roller_inter_token_latency_seconds_bucket",
                 "tvm_roller_generated_tokens_total", "tvm_roller_decode_tokens_per_second"):
        assert name in text, name
    assert metric(served, "tvm_roller_queue_depth") == 0


# -- the commands ---------------------------------------------------------------------------------
def test_generate_prints_the_streamed_text(served, capsys):
    from tvm_roller.tools.cli import main

    ids = served.tokenizer(PROMPTS[0])["input_ids"]
    assert main(["generate", served.directory, "--prompt", PROMPTS[0], "--new-tokens", "12",
                 "--max-seq-len", str(MAX_SEQ)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(hf_text(served, ids, 12) + "\n")
    assert "prefill" in out and "decode" in out and "tok/s" in out


def test_serve_command_answers_an_openai_client(served):
    """``tvm-roller serve DIR`` as the README runs it: a process that loads the compiled model
    from the module cache, listens, answers, and stops on Ctrl-C."""
    with free_socket() as sock:
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "tvm_roller.tools.cli", "serve",
                             served.directory, "--port", str(port), "--max-seq-len",
                             str(MAX_SEQ)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.completions.create(model=served.name, prompt=PROMPTS[0], max_tokens=8,
                                        temperature=0)
        ids = served.tokenizer(PROMPTS[0])["input_ids"]
        assert out.choices[0].text == hf_text(served, ids, 8)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            log = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            log = proc.communicate()[0]
    assert proc.returncode == 0, log[-3000:]
