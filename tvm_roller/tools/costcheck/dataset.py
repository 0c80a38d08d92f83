"""Measure roller's top-k and random rTiles of suite workloads: the cost check's dataset."""
from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.traffic import (accumulator_registers, input_bytes, num_tiles,
                                         output_bytes, register_loads)
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware import DeviceModel


@dataclass
class Candidate:
    """One measured rTile of one workload, with the model's prediction and the features."""

    workload: str            # "GMM:0"
    op_class: str            # "GMM"
    source: str              # "roller" (its top-k, rank = position) or "random"
    rank: int
    tile: dict
    predicted_s: float
    measured_s: float
    features: Dict[str, float] = field(default_factory=dict)


def _log2p(x: float) -> float:
    return math.log2(max(1.0, float(x)))


def features(fa: FuncAnalysis, dev: DeviceModel, t: RTile) -> Dict[str, float]:
    """Fixed-length description of an rTile for XGBoost: tile volume per level (spatial and
    reduction), register use, loads, footprints, parallelism, and the model's own terms."""
    lanes = t.vector_lanes
    S, R = fa.spatial, fa.reduction
    f: Dict[str, float] = {}
    for level in ("reg", "l1", "l2"):
        tile = getattr(t, level)
        f[f"{level}_spatial_log2"] = _log2p(np.prod([tile[i] for i in S]) if S else 1)
        f[f"{level}_reduction_log2"] = _log2p(np.prod([tile[i] for i in R]) if R else 1)
    v = t.vector_axis
    f["reg_vector"] = float(t.reg[v]) if v is not None else 0.0
    f["reg_vector_over_lanes"] = (t.reg[v] / lanes) if v is not None else 0.0
    f["accumulators"] = float(accumulator_registers(fa, t.reg, lanes))
    f["register_loads"] = float(register_loads(fa, t.reg, lanes))
    f["l1_footprint_log2"] = _log2p(input_bytes(fa, t.l1) + output_bytes(fa, t.l1))
    f["l2_footprint_log2"] = _log2p(input_bytes(fa, t.l2) + output_bytes(fa, t.l2))
    f["tasks"] = float(num_tiles(fa, t.l2, S))
    f["waves"] = float(math.ceil(f["tasks"] / dev.num_units))
    f["flops_log2"] = _log2p(fa.flops)
    for name, val in t.terms.items():
        f[f"term_{name}_log10"] = math.log10(max(val, 1e-12))
    f["predicted_log10"] = math.log10(max(t.predicted_s, 1e-12))
    return f


_ROUNDS = 2


def _time(lib, arrays, repeat: int) -> float:
    import tvm

    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    # the best of many short repeats: a tile's rate when it has the cores, which is what a
    # ranking compares (a median moves with whatever else runs on a shared machine)
    ev = lib.mod.time_evaluator("main", dev, number=1, repeat=max(repeat, 10), min_repeat_ms=5)
    return float(np.min(ev(*args).results))


def measure_workloads(ops: Optional[Sequence[str]], target=None, n_top: int = 10,
                      n_random: int = 20, repeat: int = 5, seed: int = 0,
                      device: Optional[DeviceModel] = None,
                      log=print) -> Tuple[List[Candidate], dict]:
    """Measure roller's top-``n_top`` plus ``n_random`` random valid rTiles of each workload.

    Returns the candidates and the metadata (machine, target, device model, settings)."""
    import tvm

    from tvm_roller.planner import Context, apply, plan_prepared, prepare
    from tvm_roller.tools.costcheck.sample import random_tiles
    from tvm_roller.tools.suite import workloads

    ctx = Context.make(target if target is not None else "llvm", device)
    tgt, dev = ctx.target, ctx.device
    out: List[Candidate] = []
    for cls, idx in workloads.list_workloads(ops):
        name = workloads.workload_name(cls, idx)
        func = workloads.create(cls, idx)
        p = plan_prepared(prepare(func, ctx), n_top)
        tiles = [("roller", r, t) for r, t in enumerate(p.tiles)]
        seen = {t.key() for _, _, t in tiles}
        for t in random_tiles(p.analysis, dev, n_random, seed=seed):
            if t.key() not in seen:
                tiles.append(("random", -1, t))
                seen.add(t.key())
        arrays = workloads.random_inputs(func, seed)
        shape, dtype = workloads.output_spec(func)
        arrays = arrays + [np.zeros(shape, dtype)]
        t0 = time.perf_counter()
        libs = [tvm.compile(apply(p, t).mod, target=p.target) for _, _, t in tiles]
        # timed in rounds, forward then backward, each candidate's best kept: a burst of
        # other work on the machine then hits different candidates in each round instead of
        # one contiguous run of them (roller's top-k, measured first)
        best = [math.inf] * len(tiles)
        for r in range(_ROUNDS):
            order = range(len(tiles)) if r % 2 == 0 else reversed(range(len(tiles)))
            for j in order:
                best[j] = min(best[j], _time(libs[j], arrays, repeat))
        for (source, rank, t), sec in zip(tiles, best):
            out.append(Candidate(name, cls, source, rank, t.to_dict(), t.predicted_s, sec,
                                 features(p.analysis, dev, t)))
        log(f"{name}: {len(tiles)} candidates ({sum(s == 'roller' for s, _, _ in tiles)} roller) "
            f"in {time.perf_counter() - t0:.1f} s")
    meta = {"machine": platform.node(), "processor": platform.processor() or platform.machine(),
            "target": str(tgt), "device": json.loads(dev.to_json()),
            "settings": {"n_top": n_top, "n_random": n_random, "repeat": repeat, "seed": seed},
            "date": time.strftime("%Y-%m-%d %H:%M")}
    return out, meta


def repredict(cands: List[Candidate], target=None,
              device: Optional[DeviceModel] = None) -> List[Candidate]:
    """The same measured tiles with the current micro-model's predictions (and features) for
    ``device`` (default: the target's device model on this machine): judge a model change on
    stored measurements without measuring again."""
    from tvm_roller.backends.cpu.perf_model import predict_tiled
    from tvm_roller.planner import Context, prepare
    from tvm_roller.tools.suite import workloads

    ctx = Context.make(target if target is not None else "llvm", device)
    dev = ctx.device
    analyses: Dict[str, FuncAnalysis] = {}
    out = []
    for c in cands:
        if c.workload not in analyses:
            cls, idx = c.workload.split(":")
            # what the tiles were planned for (a decomposed function: its lead part)
            analyses[c.workload] = prepare(workloads.create(cls, int(idx)), ctx).analysis
        fa = analyses[c.workload]
        t = RTile.from_json(json.dumps(c.tile))
        if t.kind == "tiled":
            predict_tiled(fa, dev, t)
        out.append(Candidate(c.workload, c.op_class, c.source, c.rank, t.to_dict(), t.predicted_s,
                             c.measured_s, features(fa, dev, t)))
    return out


def save_dataset(path: str, cands: List[Candidate], meta: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"meta": meta, "candidates": [asdict(c) for c in cands]}, fh, indent=1)


def load_dataset(path: str) -> Tuple[List[Candidate], dict]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    return [Candidate(**c) for c in data["candidates"]], data["meta"]
