"""costcheck on the base install: without matplotlib the plots are skipped with a message naming
the extra, and the tables and report.json are still written."""
from __future__ import annotations

import json
import sys

import pytest

from tvm_roller.tools.costcheck.dataset import Candidate, save_dataset
from tvm_roller.tools.costcheck.report import PLOTS_HINT, build_report, plot


def _cands():
    out = []
    for wl, cls, meas in (("GMM:0", "GMM", [1, 2, 3, 4]), ("C2D:0", "C2D", [4, 3, 2, 1]),
                          ("NRM:0", "NRM", [1, 3, 2, 4])):
        for i, m in enumerate(meas):
            out.append(Candidate(wl, cls, "roller" if i == 0 else "random", 0 if i == 0 else -1,
                                 {}, 1e-3 * (i + 1), 1e-3 * m, {"x": float(i), "y": float(m)}))
    return out


def test_costcheck_without_matplotlib(tmp_path, monkeypatch, capsys):
    from tvm_roller.tools.cli import main

    ds = tmp_path / "dataset.json"
    save_dataset(str(ds), _cands(), {"target": "llvm"})
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    out = tmp_path / "cc"
    assert main(["costcheck", "--dataset", str(ds), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert "matplotlib is not installed" in cap.err and PLOTS_HINT in cap.err
    assert "tvm-roller[bench]" in PLOTS_HINT
    assert "summary:" in cap.out and "GMM:0" in cap.out
    assert "png" not in cap.out.splitlines()[-1]  # the 'wrote' line lists only what was written
    rep = json.loads((out / "report.json").read_text())
    assert [r["op"] for r in rep["workloads"]] == ["GMM:0", "C2D:0", "NRM:0"]
    assert not list(out.glob("*.png"))


def test_plot_writes_pngs_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    cands = _cands()
    paths = plot(cands, build_report(cands), str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["predicted_vs_measured.png", "regret.png"]
    assert all((tmp_path / p.rsplit("/", 1)[-1]).stat().st_size > 0 for p in paths)
