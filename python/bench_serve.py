"""What the server costs: time to first token and decode tokens/s through ``tvm-roller serve``
(HTTP, SSE, the tokenizer, the queue) against ``tvm_roller.llm`` called directly on the same
model, one client, interleaved rounds.

    python python/bench_serve.py --config qwen2-0.5b --weights fp32,int4 --prompt-tokens 128 \\
        --new 64 --rounds 3

The model directory holds the named configuration (``tools.models.llm_configs``) with random
weights and the demo tokenizer (``make_demo_model``), padded with filler tokens to the
configuration's vocabulary. Direct: ``lm.stream_text`` in this process. Server: the
``tvm-roller serve`` command in a subprocess (compiled there, or loaded from the module cache),
driven by the ``openai`` client with ``stream=True`` and ``ignore_eos``; each streamed chunk
with text is one token (the random model writes filler tokens, a word each). Decode tok/s:
tokens after the first over the time from the first to the last. Overhead: the server's
seconds per decoded token over the direct ones, minus one.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# one sentence of the demo tokenizer's corpus words, repeated to the prompt length
SENTENCE = "The kernel compiles a tile of the tensor in the cache, fast and small. "


def make_model_dir(config: str, path: Path, max_positions: int) -> Path:
    sys.path.insert(0, str(HERE))
    from make_demo_model import save_tokenizer

    from tvm_roller.tools.models.llm_configs import build

    if (path / "config.json").is_file():
        return path
    model, cfg = build(config)
    path.mkdir(parents=True, exist_ok=True)
    save_tokenizer(path, vocab_size=512, max_positions=max_positions, pad_to=cfg.vocab_size)
    model.save_pretrained(path)
    return path


def prompt_of(tokenizer, tokens: int) -> str:
    text = ""
    while len(tokenizer.encode(text)) < tokens:
        text += SENTENCE
    ids = tokenizer.encode(text)[1:tokens]  # (the tokenizer puts bos first again)
    return tokenizer.decode(ids)


def direct_round(lm, prompt: str, new: int) -> dict:
    t0 = time.perf_counter()
    stamps = []
    for _ in lm.stream_text(prompt, new, ignore_eos=True):
        stamps.append(time.perf_counter())
    return _summary(t0, stamps)


def server_round(client, model: str, prompt: str, new: int) -> dict:
    t0 = time.perf_counter()
    stamps = []
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=new, stream=True,
                                       temperature=0.0, extra_body={"ignore_eos": True})
    for chunk in stream:  # (the last chunk, with the finish reason only, carries no text)
        if chunk.choices and chunk.choices[0].text:
            stamps.append(time.perf_counter())
    return _summary(t0, stamps)


def _summary(t0: float, stamps: list) -> dict:
    n = len(stamps)
    decode_s = stamps[-1] - stamps[0] if n > 1 else float("nan")
    return {"tokens": n, "ttft_s": stamps[0] - t0, "decode_tok_s": (n - 1) / decode_s}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: Path, weights: str, max_seq_len: int):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tvm_roller.tools.cli", "serve", str(model_dir), "--weights",
         weights, "--port", str(port), "--max-seq-len", str(max_seq_len)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    import httpx

    deadline = time.time() + 3600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stdout.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            time.sleep(1)
    proc.kill()
    raise RuntimeError("the server did not listen within an hour")


def bench_format(model_dir: Path, weights: str, args) -> dict:
    import openai

    from tvm_roller.integrations import llm

    max_seq_len = args.prompt_tokens + args.new + 8
    proc, port = start_server(model_dir, weights, max_seq_len)
    try:
        lm = llm.load(model_dir, max_seq_len=max_seq_len, weights=weights)
        prompt = prompt_of(lm.tokenizer, args.prompt_tokens)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        name = model_dir.name
        direct_round(lm, prompt, 4)  # warm both
        server_round(client, name, prompt, 4)
        rows = {"direct": [], "server": []}
        for _ in range(args.rounds):
            rows["direct"].append(direct_round(lm, prompt, args.new))
            rows["server"].append(server_round(client, name, prompt, args.new))
    finally:
        proc.terminate()
        proc.wait(60)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("ttft_s", "decode_tok_s")}
           for k, v in rows.items()}
    overhead = med["direct"]["decode_tok_s"] / med["server"]["decode_tok_s"] - 1.0
    out = {"weights": weights, "prompt_tokens": args.prompt_tokens, "new": args.new,
           "rounds": rows, "median": med, "decode_overhead": overhead,
           "ttft_overhead_s": med["server"]["ttft_s"] - med["direct"]["ttft_s"]}
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def table(results: list) -> str:
    lines = ["| weights | direct TTFT ms | server TTFT ms | direct decode tok/s | "
             "server decode tok/s | server overhead on decode |", "|---|---|---|---|---|---|"]
    for r in results:
        d, s = r["median"]["direct"], r["median"]["server"]
        lines.append(f"| {r['weights']} | {1e3 * d['ttft_s']:.1f} | {1e3 * s['ttft_s']:.1f} | "
                     f"{d['decode_tok_s']:.2f} | {s['decode_tok_s']:.2f} | "
                     f"{100 * r['decode_overhead']:+.1f}% |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2-0.5b")
    ap.add_argument("--weights", default="fp32,int4")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="model directory (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(args.config, Path(args.dir or Path(tmp) / args.config),
                                   args.prompt_tokens + args.new + 8)
        results = [bench_format(model_dir, w, args) for w in args.weights.split(",")]
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
