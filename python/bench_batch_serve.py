"""Many users at once: ``tvm-roller serve --max-batch N`` (continuous batching, paged KV cache)
against llama.cpp's own ``llama-server`` on the same weights, closed-loop streaming clients.

    python python/bench_batch_serve.py --config qwen2-0.5b --weights fp32,int4 \\
        --clients 1,4,8,16 --duration 180 --warmup 30 --llama-server PATH/llama-server

Each client sends a request, reads its stream to the end, and sends the next: a prompt of
``--min-prompt``..``--max-prompt`` random token ids (uniform, seeded per client: both servers
get the same prompts in the same order) and ``--new`` tokens (``ignore_eos``). Per client
count, each server in its own block (ours, then llama-server's): ``--warmup`` seconds
discarded, then ``--duration`` seconds measured, then the clients stop (requests in flight are
dropped).

* aggregate tok/s: tokens streamed inside the window over its length;
* decode-phase tok/s: the clients times the mean per-request decode rate (tokens after the
  first over the time from the first to the last);
* decode-step tok/s (ours only, from the server's ``/metrics``): the tokens its decode steps
  made inside the window over the seconds they took: the decode phase without the waits
  behind other requests' prefill chunks, which the decode-phase figure includes;
* TTFT (send to first token) and ITL (gaps between a request's tokens): p50 / p99 over the
  requests sent inside the window.

The model directory holds the configuration (random weights, the demo tokenizer padded to its
vocabulary, ``bench_serve.make_model_dir``); llama-server reads the same weights as a GGUF
(``llamacpp_peer.write_gguf``: f32 for fp32, q4_0 for int4, a placeholder vocabulary: prompts
are token ids). llama-server runs with ``-np <max-batch> -c <max-batch x (max prompt + new)>
-t 2``; ``--llama-repack auto`` (the default) keeps llama.cpp's repacked weight layouts except
on a CPU with AMX, where its repacked AMX kernels die on quantized files (``llamacpp_peer``), so
there quantized files run with ``--no-repack``. ``--soak S``: our server alone at ``--clients``
for S seconds, the failures and its resident memory at minute 1 and at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_serve import _free_port, make_model_dir  # noqa: E402

FIRST_ID = 600  # prompts draw from the filler tokens: plain words in both vocabularies
GGUF_TYPES = {"fp32": "f32", "int4": "q4_0", "int8": "q8_0"}


@dataclass
class Request:
    sent: float
    stamps: List[float] = field(default_factory=list)
    error: Optional[str] = None


@dataclass
class Server:
    kind: str  # "roller" or "llama"
    url: str
    proc: subprocess.Popen

    def body(self, ids: list, new: int) -> tuple:
        """The path and JSON of a streaming request for ``new`` tokens after ``ids``."""
        if self.kind == "roller":
            return "/v1/completions", {"model": "m", "prompt": ids, "max_tokens": new,
                                       "stream": True, "temperature": 0, "ignore_eos": True}
        return "/completion", {"prompt": ids, "n_predict": new, "stream": True,
                               "temperature": 0, "ignore_eos": True, "cache_prompt": False}

    def decode_counters(self) -> Optional[tuple]:
        """Ours: (tokens made by decode steps, seconds inside them) from ``/metrics``."""
        if self.kind != "roller":
            return None
        import httpx

        found = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            name, _, value = line.partition(" ")
            if name in ("tvm_roller_decode_rows_total", "tvm_roller_decode_seconds_total"):
                found[name] = float(value)
        return (found["tvm_roller_decode_rows_total"],
                found["tvm_roller_decode_seconds_total"]) if len(found) == 2 else None

    @staticmethod
    def text(event: dict) -> str:
        if "choices" in event:
            return "".join(c.get("text") or "" for c in event["choices"])
        return event.get("content") or ""


def _wait_healthy(url: str, proc: subprocess.Popen, what: str, limit: float = 3600) -> None:
    import httpx

    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {proc.stdout.read()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"{what} did not listen in {limit} s")


def start_roller(model_dir: Path, weights: str, args) -> Server:
    port = _free_port()
    cmd = [sys.executable, "-m", "tvm_roller.tools.cli", "serve", str(model_dir), "--weights",
           weights, "--port", str(port), "--max-seq-len", str(args.max_prompt + args.new),
           "--max-batch", str(args.max_batch), "--model-name", "m", "--max-queue", "64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = Server("roller", f"http://127.0.0.1:{port}", proc)
    _wait_healthy(server.url, proc, "tvm-roller serve")
    _drain(proc)
    return server


def start_llama(gguf: Path, weights: str, args) -> Server:
    port = _free_port()
    ctx = args.max_batch * (args.max_prompt + args.new)
    cmd = [args.llama_server, "-m", str(gguf), "--port", str(port), "-np", str(args.max_batch),
           "-c", str(ctx), "-t", "2", "--no-warmup"]
    if weights != "fp32" and not _llama_repacks(args.llama_repack):
        cmd.append("--no-repack")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = Server("llama", f"http://127.0.0.1:{port}", proc)
    _wait_healthy(server.url, proc, "llama-server", 600)
    _drain(proc)
    return server


def _llama_repacks(choice: str) -> bool:
    """Whether llama-server may repack quantized weights: ``auto`` = unless the CPU has AMX."""
    if choice != "auto":
        return choice == "on"
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "amx_tile" not in flags


def _drain(proc: subprocess.Popen) -> None:
    """Read the server's log in the background (a full pipe would block it)."""
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()


def one_request(client, server: Server, ids: list, new: int, stop_at: float) -> Request:
    path, body = server.body(ids, new)
    req = Request(time.perf_counter())
    try:
        # a connection per request: a kept-alive one the server closes as the next request
        # goes out reads as a failure that is the client's, not the server's
        with client.stream("POST", server.url + path, json=body, timeout=600,
                           headers={"Connection": "close"}) as res:
            if res.status_code != 200:
                req.error = f"HTTP {res.status_code}: {res.read()[:200]!r}"
                return req
            for line in res.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    req.error = str(event["error"])[:200]
                    return req
                if server.text(event):
                    req.stamps.append(time.perf_counter())
                if time.perf_counter() > stop_at:
                    return req  # the window is over: drop the rest
    except Exception as e:  # noqa: BLE001 - a failed request is counted, the client goes on
        req.error = f"{type(e).__name__}: {e}"[:200]
    return req


def run_clients(server: Server, clients: int, warmup: float, duration: float, args,
                on_minute=None) -> dict:
    """``clients`` closed-loop clients for ``warmup + duration`` seconds; the window's figures."""
    import httpx

    t_start = time.perf_counter()
    t0, t1 = t_start + warmup, t_start + warmup + duration
    done: List[List[Request]] = [[] for _ in range(clients)]

    def client_loop(i: int) -> None:
        rng = np.random.default_rng(args.seed * 1000 + i)
        with httpx.Client() as client:
            while time.perf_counter() < t1:
                n = int(rng.integers(args.min_prompt, args.max_prompt + 1))
                ids = rng.integers(FIRST_ID, args.vocab, n).tolist()
                done[i].append(one_request(client, server, ids, args.new, t1))

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True)
               for i in range(clients)]
    for t in threads:
        t.start()
    counters = {}  # the server's decode counters at the window's edges
    while any(t.is_alive() for t in threads):
        now = time.perf_counter()
        for edge in (t0, t1):
            if now >= edge and edge not in counters:
                counters[edge] = server.decode_counters()
        if on_minute is not None:
            on_minute(now - t_start)
        time.sleep(0.5)
    for t in threads:
        t.join()
    if t0 in counters and t1 not in counters:
        # the clients stop at their first token after t1 (a rate: the tail's few steps move
        # rows and seconds alike)
        counters[t1] = server.decode_counters()
    r = summarize([r for rows in done for r in rows], clients, t0, t1, args.new)
    if counters.get(t0) and counters.get(t1):
        made, secs = (b - a for a, b in zip(counters[t0], counters[t1]))
        r["decode_step_tok_s"] = made / secs if secs > 0 else float("nan")
    return r


def _pct(values: list, q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(reqs: List[Request], clients: int, t0: float, t1: float, new: int) -> dict:
    inside = [r for r in reqs if t0 <= r.sent < t1]
    tokens = sum(1 for r in reqs for s in r.stamps if t0 <= s < t1)
    ttft = [r.stamps[0] - r.sent for r in inside if r.stamps]
    itl = [b - a for r in inside for a, b in zip(r.stamps, r.stamps[1:])]
    rates = [(len(r.stamps) - 1) / (r.stamps[-1] - r.stamps[0]) for r in inside
             if len(r.stamps) > 1 and r.stamps[-1] > r.stamps[0]]
    complete = [r for r in inside if len(r.stamps) == new]
    return {"clients": clients, "window_s": t1 - t0, "requests": len(inside),
            "completed": len(complete),
            "failed": sum(1 for r in reqs if r.error), "errors": sorted({r.error for r in reqs
                                                                        if r.error})[:3],
            "aggregate_tok_s": tokens / (t1 - t0),
            "decode_tok_s": clients * statistics.mean(rates) if rates else float("nan"),
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            "itl_p50_s": _pct(itl, 50), "itl_p99_s": _pct(itl, 99)}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def gguf_for(model_dir: Path, weights: str) -> Path:
    import transformers

    sys.path.insert(0, str(HERE))
    from llamacpp_peer import write_gguf

    path = model_dir / f"model-{GGUF_TYPES[weights]}.gguf"
    if not path.is_file():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
        write_gguf(model, str(path), GGUF_TYPES[weights])
    return path


def bench_weights(model_dir: Path, weights: str, args) -> List[dict]:
    rows = []
    ours = start_roller(model_dir, weights, args)
    peer = None if not args.llama_server else start_llama(gguf_for(model_dir, weights),
                                                          weights, args)
    try:
        for clients in args.clients:
            for server in (ours, peer):
                if server is None:
                    continue
                r = run_clients(server, clients, args.warmup, args.duration, args)
                r.update(server=server.kind, weights=weights)
                if server.kind == "llama":
                    r["repack"] = weights == "fp32" or _llama_repacks(args.llama_repack)
                print(json.dumps(r), flush=True)
                rows.append(r)
                time.sleep(3)  # dropped requests leave the servers
    finally:
        for s in (ours, peer):
            if s is not None:
                s.proc.terminate()
                s.proc.wait(60)
    return rows


def soak(model_dir: Path, weights: str, args) -> dict:
    ours = start_roller(model_dir, weights, args)
    marks = {}

    def on_minute(elapsed: float) -> None:
        minute = int(elapsed // 60)
        marks.setdefault(minute, rss_mb(ours.proc.pid))

    try:
        r = run_clients(ours, args.clients[0], 0.0, args.soak, args, on_minute)
        marks.setdefault(int(args.soak // 60), rss_mb(ours.proc.pid))  # at the end
    finally:
        ours.proc.terminate()
        ours.proc.wait(60)
    last = max(marks)
    r.update(server="roller", weights=weights, soak_s=args.soak, rss_mb_by_minute=marks,
             rss_growth=marks[last] / marks[1] - 1.0 if 1 in marks else float("nan"))
    print(json.dumps(r), flush=True)
    return r


def table(rows: List[dict]) -> str:
    lines = ["| weights | clients | server | aggregate tok/s | decode-phase tok/s | decode-step "
             "tok/s | TTFT p50 / p99 s | ITL p50 / p99 ms | requests (failed) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        step = r.get("decode_step_tok_s")
        lines.append(f"| {r['weights']} | {r['clients']} | {r['server']} | "
                     f"{r['aggregate_tok_s']:.1f} | {r['decode_tok_s']:.1f} | "
                     f"{'—' if step is None else f'{step:.1f}'} | "
                     f"{r['ttft_p50_s']:.2f} / {r['ttft_p99_s']:.2f} | "
                     f"{1e3 * r['itl_p50_s']:.0f} / {1e3 * r['itl_p99_s']:.0f} | "
                     f"{r['requests']} ({r['failed']}) |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2-0.5b")
    ap.add_argument("--weights", default="fp32,int4")
    ap.add_argument("--clients", default="1,4,8,16")
    ap.add_argument("--duration", type=float, default=180.0)
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--min-prompt", type=int, default=32)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama-server", default=None, help="the llama-server binary (no peer "
                    "without it)")
    ap.add_argument("--llama-repack", choices=("auto", "on", "off"), default="auto",
                    help="llama-server's repacked weight layouts for quantized files")
    ap.add_argument("--soak", type=float, default=0.0,
                    help="seconds of a soak of our server alone at --clients (the first)")
    ap.add_argument("--dir", default=None, help="model directory (default: under /tmp)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    model_dir = Path(args.dir or f"/tmp/tvm_roller_bench/{args.config}")
    make_model_dir(args.config, model_dir, args.max_prompt + args.new)
    args.vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    rows = []
    for weights in args.weights.split(","):
        if args.soak:
            rows.append(soak(model_dir, weights, args))
        else:
            rows += bench_weights(model_dir, weights, args)
    if not args.soak:
        print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
