"""Benchmark plumbing the scripts in ``python/`` share: one model per fresh process, per-kernel
times of a Relax VM (``measure``), and the matmul chains BENCHMARKS.md measures (``chains``)."""
