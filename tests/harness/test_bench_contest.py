"""The benchmarks' contest: roller's build and every peer run the same model, each peer's output
is compared with PyTorch's, and all are timed in one interleaved run. A peer that cannot run
(not installed, or its converter fails) is reported with its error, never dropped."""
from __future__ import annotations

import os

import numpy as np
import torch

import tvm_roller
from harness.bench import contest


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(37, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 13)).eval()


def test_roller_against_peers_on_a_small_model():
    import tvm
    from tvm import relax

    from tvm_roller.integrations.pytorch import import_torch

    model, x = _mlp(), torch.randn(3, 37)
    with torch.no_grad():
        ref = model(x).numpy().astype(np.float64)
    ex = tvm_roller.relax.compile(import_torch(model, x), "llvm", cache=False)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    arg = tvm.runtime.tensor(x.numpy())
    out = vm["main"](arg)
    out = (out.numpy() if hasattr(out, "numpy") else out[0].numpy()).astype(np.float64)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()
    res = contest.against_peers(lambda: vm["main"](arg), model, x, ref,
                                len(os.sched_getaffinity(0)), inductor=False,
                                rounds=2, block_s=0.02, pause_s=0.0)
    assert res["roller_ms"] > 0
    assert set(res["peers"]) == {"eager", "onnxruntime", "openvino"}
    for name, p in res["peers"].items():
        assert ("ms" in p) != bool(p["error"]), (name, p)  # timed, or says why not
        if "ms" in p:
            assert p["ms"] > 0 and p["rel_err"] <= 1e-4, (name, p)
    assert res["peers"]["eager"]["rel_err"] == 0.0  # PyTorch itself is the reference
    best = contest.best_peer(res["peers"])
    timed = [p["ms"] for p in res["peers"].values() if "ms" in p]
    assert best is not None and best[1] == min(timed)


def test_best_peer_ignores_a_wrong_or_failing_peer():
    peers = {"eager": {"ms": 5.0, "rel_err": 0.0}, "fast_but_wrong": {"ms": 1.0, "rel_err": 0.5},
             "broken": {"error": "conversion failed"}}
    assert contest.best_peer(peers) == ("eager", 5.0)
    assert contest.best_peer({"broken": {"error": "x"}}) is None
