"""Rank quality of the analytical model and of an XGBoost regressor, per workload and overall.

All correlations are between predicted and measured latency (positive is good). XGBoost is
cross-validated by workload: each workload's candidates are predicted by a model trained on the
other workloads only, so no workload is in both the train and the test set.
"""
from __future__ import annotations

import math
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, TextIO

import numpy as np

from tvm_roller.tools.costcheck.dataset import Candidate

#: the extra that installs matplotlib for the plots (setup.py ``bench``)
PLOTS_HINT = "pip install 'tvm-roller[bench]'"
TOPK_RECALL = 5
MIN_CANDIDATES = 3  # fewer candidates cannot be ranked meaningfully
_XGB_PARAMS = {"objective": "reg:squarederror", "max_depth": 5, "eta": 0.05, "subsample": 0.9,
               "colsample_bytree": 0.9, "nthread": 1}


def _corr(pred: Sequence[float], meas: Sequence[float]):
    from scipy import stats

    if len(pred) < MIN_CANDIDATES or len(set(pred)) < 2 or len(set(meas)) < 2:
        return None, None
    return float(stats.spearmanr(pred, meas)[0]), float(stats.kendalltau(pred, meas)[0])


def _regret(pred: Sequence[float], meas: Sequence[float]) -> float:
    return float(meas[int(np.argmin(pred))] / min(meas))


def _recall(pred: Sequence[float], meas: Sequence[float], k: int) -> float:
    k = min(k, len(pred))
    top_pred = set(np.argsort(pred, kind="stable")[:k].tolist())
    top_meas = set(np.argsort(meas, kind="stable")[:k].tolist())
    return len(top_pred & top_meas) / k


def xgb_cross_validated(cands: List[Candidate], seed: int = 0) -> Optional[Dict[int, float]]:
    """Leave-one-workload-out predictions of log10(latency): {candidate index: prediction}."""
    import xgboost as xgb

    groups = sorted({c.workload for c in cands})
    if len(groups) < 2:
        return None
    names = sorted({k for c in cands for k in c.features})
    X = np.array([[c.features.get(k, 0.0) for k in names] for c in cands])
    y = np.array([math.log10(c.measured_s) for c in cands])
    out: Dict[int, float] = {}
    for g in groups:
        test = [i for i, c in enumerate(cands) if c.workload == g]
        train = [i for i, c in enumerate(cands) if c.workload != g]
        booster = xgb.train(_XGB_PARAMS | {"seed": seed}, xgb.DMatrix(X[train], label=y[train]),
                            num_boost_round=300)
        for i, p in zip(test, booster.predict(xgb.DMatrix(X[test]))):
            out[i] = float(p)
    return out


def build_report(cands: List[Candidate], meta: Optional[dict] = None) -> dict:
    """The report.json object (see the CLI's help for the fields)."""
    xgb_pred = xgb_cross_validated(cands)
    by_wl: Dict[str, List[int]] = defaultdict(list)
    for i, c in enumerate(cands):
        by_wl[c.workload].append(i)
    rows = []
    for wl, idx in by_wl.items():
        meas = [cands[i].measured_s for i in idx]
        pred = [cands[i].predicted_s for i in idx]
        sp_m, kt_m = _corr(pred, meas)
        sp_x = kt_x = None
        if xgb_pred is not None:
            sp_x, kt_x = _corr([xgb_pred[i] for i in idx], meas)
        roller_top1 = [i for i in idx if cands[i].source == "roller" and cands[i].rank == 0]
        # top-1 regret of the model's choice among everything measured (its own top-1 is the
        # best-predicted candidate only if no random tile is predicted faster)
        regret = _regret(pred, meas)
        rows.append({
            "op": wl, "op_class": cands[idx[0]].op_class, "n_candidates": len(idx),
            "spearman_model": sp_m, "kendall_model": kt_m,
            "spearman_xgb": sp_x, "kendall_xgb": kt_x,
            "top1_regret": regret,
            "roller_top1_regret": (cands[roller_top1[0]].measured_s / min(meas)
                                   if roller_top1 else None),
            "topk_recall_model": _recall(pred, meas, TOPK_RECALL) if len(idx) >= MIN_CANDIDATES
            else None,
            "topk_recall_xgb": (_recall([xgb_pred[i] for i in idx], meas, TOPK_RECALL)
                                if xgb_pred is not None and len(idx) >= MIN_CANDIDATES else None),
            "best_measured_s": min(meas),
        })
    rankable = [r for r in rows if r["spearman_model"] is not None]

    def med(key):
        vals = [r[key] for r in rankable if r[key] is not None]
        return float(np.median(vals)) if vals else None

    summary = {
        "n_workloads": len(rows), "n_rankable": len(rankable),
        "median_spearman_model": med("spearman_model"),
        "median_kendall_model": med("kendall_model"),
        "median_spearman_xgb": med("spearman_xgb"),
        "median_kendall_xgb": med("kendall_xgb"),
        "top1_within10_frac": (float(np.mean([r["top1_regret"] <= 1.1 for r in rows]))
                               if rows else None),
        "median_topk_recall_model": med("topk_recall_model"),
        "median_topk_recall_xgb": med("topk_recall_xgb"),
        "topk": TOPK_RECALL,
    }
    return {"workloads": rows, "summary": summary, "meta": meta or {}}


def plot(cands: List[Candidate], report: dict, out_dir: str,
         out: Optional[TextIO] = None) -> List[str]:
    """predicted_vs_measured.png (one panel per op class) and regret.png; returns the paths.
    matplotlib is not a base dependency: without it, says so on ``out`` (stderr) and returns []."""
    try:
        import matplotlib
    except ImportError:
        print(f"plots skipped: matplotlib is not installed ({PLOTS_HINT} to get "
              "predicted_vs_measured.png and regret.png)", file=out or sys.stderr)
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    classes = sorted({c.op_class for c in cands})
    cols = min(4, len(classes))
    rows_n = math.ceil(len(classes) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 3.4 * rows_n), squeeze=False)
    for ax, cls in zip(axes.flat, classes):
        for src, marker in (("random", "."), ("roller", "o")):
            pts = [(c.predicted_s * 1e3, c.measured_s * 1e3) for c in cands
                   if c.op_class == cls and c.source == src]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, s=14 if marker == "." else 22,
                           label=f"{src} rTiles", alpha=0.8)
        ax.set_xscale("log"); ax.set_yscale("log")
        ax.set_title(cls); ax.set_xlabel("predicted (ms)"); ax.set_ylabel("measured (ms)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(classes):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("roller's micro-model: predicted vs measured latency per op class")
    fig.tight_layout()
    p = f"{out_dir}/predicted_vs_measured.png"
    fig.savefig(p, dpi=110); plt.close(fig); paths.append(p)

    wl = report["workloads"]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(wl)), 3.6))
    ax.bar([r["op"] for r in wl], [r["top1_regret"] for r in wl])
    ax.axhline(1.1, color="red", ls="--", lw=1, label="10% regret")
    ax.set_ylabel("top-1 regret (measured / best)")
    ax.set_title("regret of the model's top-1 per workload")
    ax.tick_params(axis="x", rotation=70)
    ax.legend()
    fig.tight_layout()
    p = f"{out_dir}/regret.png"
    fig.savefig(p, dpi=110); plt.close(fig); paths.append(p)
    return paths
