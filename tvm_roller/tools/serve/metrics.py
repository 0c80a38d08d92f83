"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own (two servers
in one process, as in the tests, do not collide): queue depth, time to first token,
inter-token latency, tokens generated (tokens/s is their rate), each request's outcome, and a
batching worker's KV-cache blocks (free of total), batch size, decode steps' rows and
seconds, and preemptions."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

OUTCOMES = ("stop", "length", "cancelled", "error", "rejected")
# seconds: a tiny model's token takes ~0.2 ms, a 1B model's tens of ms on 2 cores
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    """Updated by the engine (admission) and the worker (generation); thread-safe."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "tvm_roller_"
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting for the engine",
                                 registry=r)
        self.running = Gauge(p + "requests_running", "Requests generating now", registry=r)
        self.requests = Counter(p + "requests", "Requests by outcome (stop, length, "
                                "cancelled, error, rejected)", ["outcome"], registry=r)
        for outcome in OUTCOMES:  # each series from the start, at 0
            self.requests.labels(outcome)
        self.queue_time = Histogram(p + "queue_seconds", "Seconds from arrival to the start "
                                    "of generation", buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Seconds from arrival to the "
                              "first token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Seconds between two tokens "
                             "of a request", buckets=_LATENCY_BUCKETS, registry=r)
        self.duration = Histogram(p + "request_duration_seconds", "Seconds from arrival to "
                                  "the last token", buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens prefilled",
                                     registry=r)
        self.generated_tokens = Counter(p + "generated_tokens", "Tokens generated",
                                        registry=r)
        self.decode_tok_s = Gauge(p + "decode_tokens_per_second", "The last request's decode "
                                  "tokens per second", registry=r)

        # the paged cache of a batching worker (--max-batch > 1)
        self.kv_blocks_total = Gauge(p + "kv_cache_blocks", "Blocks in the KV-cache pool",
                                     registry=r)
        self.kv_blocks_free = Gauge(p + "kv_cache_free_blocks", "Blocks of the KV-cache pool "
                                    "no sequence holds", registry=r)
        self.batch_rows = Gauge(p + "decode_batch_size", "Sequences in the last decode step",
                                registry=r)
        self.decode_rows = Counter(p + "decode_rows", "Tokens made by decode steps (one a "
                                   "sequence a step)", registry=r)
        self.decode_seconds = Counter(p + "decode_seconds", "Seconds inside decode steps: "
                                      "decode_rows over it is the decode-phase throughput, "
                                      "prefill chunks excluded", registry=r)
        self.preemptions = Counter(p + "preemptions", "Sequences preempted (blocks freed, "
                                   "recomputed later) when the pool ran out", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
