"""Roller against the runtimes a CPU user would pick, on one model: every peer made ready
(``peers``), its output compared with PyTorch's, then all timed in one interleaved run, each in
its own short blocks (``interleaved``). The benchmark scripts share it."""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np

from harness.bench import interleaved, peers


def against_peers(roller: Callable[[], object], model, x, ref: np.ndarray, threads: int,
                  inductor: bool = True, **timing) -> Dict[str, object]:
    """``{"roller_ms", "roller_spread", "peers": {name: {ms, spread, rel_err, setup_s, error,
    notes}}}``: ``roller`` runs roller's build once; ``ref`` is PyTorch's output (float64);
    ``timing``: ``interleaved.time_blocks``'s rounds and block lengths."""
    scale = float(np.abs(ref).max()) or 1.0
    contenders = [peers.make_eager(model, x)]
    if inductor:
        contenders.append(peers.make_inductor(model, x))
    contenders += [peers.make_onnxruntime(model, x, threads),
                   peers.make_openvino(model, x, threads)]
    runs = {"roller": roller}
    info: Dict[str, dict] = {}
    for c in contenders:
        info[c.name] = {"setup_s": c.setup_s, "error": c.error, "notes": c.notes}
        if c.run is not None:
            info[c.name]["rel_err"] = float(np.abs(c.output.astype(np.float64) - ref).max()
                                            / scale)
            runs[c.name] = c.run
    times = interleaved.time_blocks(runs, **timing)
    for name, t in times.items():
        if name != "roller":
            info[name].update(ms=t["median_s"] * 1e3, spread=t["spread"])
    return {"roller_ms": times["roller"]["median_s"] * 1e3,
            "roller_spread": times["roller"]["spread"], "peers": info}


def best_peer(peer_info: Dict[str, dict]):
    """(name, ms) of the fastest peer whose output matched (rel. error <= 1e-3), or None."""
    ok = [(name, p["ms"]) for name, p in peer_info.items()
          if "ms" in p and p.get("rel_err", 1.0) <= 1e-3]
    return min(ok, key=lambda kv: kv[1]) if ok else None
