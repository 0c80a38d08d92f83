"""Re-rank a cost-check dataset with other ways of combining the micro-model's terms.

The model predicts max(terms) (compute, L1, L2, outer-level traffic, ...). This script asks, on the
measured candidates of ``tvm-roller costcheck`` (no new measurements), how other combinations would
have ranked them: median Spearman and the share of workloads whose top-1 is within 10% of the best,
over all workloads and separately per shape index (fit on one, check on the other).

    python python/costcheck_combinations.py docs/costcheck/dataset.json

Then rows with an accumulator-traffic term the model lacks, and the last rows recalibrate the model's constants on the measurements: one weight per term (compute,
L1, L2, outer level, compulsory DRAM), fitted leave-one-workload-out (the weights that rank a
workload never saw its measurements) by least squares on per-workload-centred log times, then
combined by max (the model's form) or by sum. A last table gives each feature's median rank
correlation with the measured times.
"""
from __future__ import annotations

import math
import sys
from collections import defaultdict

import numpy as np
from scipy import stats

from tvm_roller.tools.costcheck.dataset import load_dataset


def _term(c, name: str) -> float:
    t = c.tile["terms"]
    if name == "outer":  # the shared level the model charged (L3 or DRAM)
        return max([v for k, v in t.items() if k in ("L3", "DRAM")] or [0.0])
    return t.get(name, 0.0)


COMBINATIONS = {
    "max (the model)": lambda c: max(c.tile["terms"].values()),
    "sum of terms": lambda c: sum(v for k, v in c.tile["terms"].items() if k != "DRAM-once"),
    "max(sum, DRAM-once) (tried, reverted)": lambda c: max(
        sum(v for k, v in c.tile["terms"].items() if k != "DRAM-once"),
        c.tile["terms"].get("DRAM-once", 0.0)),
    "max(compute, L1) + L2 + outer": lambda c: max(_term(c, "compute"), _term(c, "L1")) +
    _term(c, "L2") + _term(c, "outer"),
    "max + L2": lambda c: c.predicted_s + _term(c, "L2"),
    "L2 alone": lambda c: _term(c, "L2"),
}


def accumulator_term(c, l1_bytes_per_s: float) -> float:
    """A term the model lacks: each reduction chunk reloads and stores the task's accumulators
    (outputs x chunks x 8 B through L1, the work split over at most two cores)."""
    t = c.tile
    spatial = [i for i, k in enumerate(t["axis_kinds"]) if k == "S"]
    red = [i for i, k in enumerate(t["axis_kinds"]) if k == "R"]
    outputs = math.prod(t["extents"][i] for i in spatial)
    chunks = math.prod(math.ceil(t["extents"][i] / t["l1"][i]) for i in red)
    return outputs * chunks * 8 / l1_bytes_per_s / max(1, min(2, t["num_tasks"]))


def feature_correlations(by_wl) -> dict:
    """Median over workloads of each feature's Spearman correlation with the measured time."""
    wls = [w for w, cs in by_wl.items() if len(cs) >= 3]
    out = {}
    for f in sorted(by_wl[wls[0]][0].features):
        sps = []
        for w in wls:
            x = [c.features.get(f, 0.0) for c in by_wl[w]]
            if len(set(x)) > 1:
                sps.append(stats.spearmanr(x, [c.measured_s for c in by_wl[w]])[0])
        if sps:
            out[f] = (float(np.median(sps)), len(sps))
    return out


_FIT_TERMS = ("compute", "L1", "L2", "outer", "DRAM-once")


def _term_matrix(cs) -> np.ndarray:
    return np.array([[max(_term(c, n), 1e-12) for n in _FIT_TERMS] for c in cs])


def _combine(log_w: np.ndarray, x: np.ndarray, how: str) -> np.ndarray:
    z = x * np.exp(log_w)
    return z.max(axis=1) if how == "max" else z.sum(axis=1)


def _fit_weights(by_wl, train, how: str) -> np.ndarray:
    from scipy import optimize

    data = [(_term_matrix(by_wl[w]), np.log([c.measured_s for c in by_wl[w]])) for w in train]

    def loss(log_w):
        total = 0.0
        for x, y in data:  # per-workload centring: only the ranking within a workload matters
            p = np.log(_combine(log_w, x, how))
            total += float((((p - p.mean()) - (y - y.mean())) ** 2).mean())
        return total

    return optimize.minimize(loss, np.zeros(len(_FIT_TERMS)), method="Nelder-Mead",
                             options={"maxiter": 4000, "xatol": 1e-3, "fatol": 1e-7}).x


def evaluate_calibrated(by_wl, how: str, shape=None):
    """Leave-one-workload-out: each workload ranked with weights fitted on the others."""
    wls = [w for w, cs in by_wl.items() if len(cs) >= 3]
    sps, within = [], []
    for wl in wls:
        if shape is not None and not wl.endswith(f":{shape}"):
            continue
        log_w = _fit_weights(by_wl, [w for w in wls if w != wl], how)
        pred = _combine(log_w, _term_matrix(by_wl[wl]), how)
        meas = [c.measured_s for c in by_wl[wl]]
        if len(set(pred)) > 1:
            sps.append(stats.spearmanr(pred, meas)[0])
        within.append(meas[int(np.argmin(pred))] / min(meas) <= 1.1)
    return float(np.median(sps)), float(np.mean(within)), len(within)


def evaluate(by_wl, fn, shape=None):
    sps, within = [], []
    for wl, cs in by_wl.items():
        if len(cs) < 3 or (shape is not None and not wl.endswith(f":{shape}")):
            continue
        pred = [fn(c) for c in cs]
        meas = [c.measured_s for c in cs]
        if len(set(pred)) > 1:
            sps.append(stats.spearmanr(pred, meas)[0])
        within.append(meas[int(np.argmin(pred))] / min(meas) <= 1.1)
    return float(np.median(sps)), float(np.mean(within)), len(within)


def main() -> int:
    cands, meta = load_dataset(sys.argv[1] if len(sys.argv) > 1 else "docs/costcheck/dataset.json")
    by_wl = defaultdict(list)
    for c in cands:
        by_wl[c.workload].append(c)
    shapes = sorted({wl.split(":")[1] for wl in by_wl})
    print(f"dataset: {len(cands)} candidates, {len(by_wl)} workloads, {meta.get('date')}")
    head = "| combination | all: median Spearman | all: top-1 within 10% |" + "".join(
        f" shape {s}: Spearman / within 10% |" for s in shapes)
    print(head)
    print("|---" * (3 + len(shapes)) + "|")
    l1 = meta["device"]["levels"][0]["bandwidth_gbs"] * 1e9
    combos = dict(COMBINATIONS)
    combos["accumulator term alone"] = lambda c: accumulator_term(c, l1)
    combos["max + accumulator term"] = lambda c: max(c.tile["terms"].values()) + \
        accumulator_term(c, l1)
    combos["sum of terms + accumulator term"] = lambda c: COMBINATIONS["sum of terms"](c) + \
        accumulator_term(c, l1)
    rows = [(name, lambda shape, fn=fn: evaluate(by_wl, fn, shape))
            for name, fn in combos.items()]
    rows += [(f"calibrated weights, {how} (leave-one-workload-out)",
              lambda shape, how=how: evaluate_calibrated(by_wl, how, shape)) for how in ("max", "sum")]
    for name, ev in rows:
        sp, w, n = ev(None)
        row = f"| {name} | {sp:.2f} | {w:.2f} ({n}) |"
        for s in shapes:
            sp_s, w_s, _ = ev(s)
            row += f" {sp_s:.2f} / {w_s:.2f} |"
        print(row)
    print()
    print("| feature | median Spearman with the measured time (workloads) |")
    print("|---|---|")
    for f, (sp, n) in sorted(feature_correlations(by_wl).items(), key=lambda kv: -abs(kv[1][0])):
        print(f"| {f} | {sp:+.2f} ({n}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
