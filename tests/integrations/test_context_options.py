"""The options live in the Context: made once at the edge, read below it; ``cache=False`` reads
and writes nothing, a passed ScheduleCache is the one that receives the tiles, and MetaSchedule's
candidates go through the planner's one path (with a report entry)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tvm
import tvm_roller
from tvm_roller.cache import ScheduleCache
from tvm_roller.planner import Context

from conftest import TARGET, device, gather_sum_func, matmul_func

torch.manual_seed(0)
_MODEL = torch.nn.Sequential(torch.nn.Linear(23, 37), torch.nn.GELU(),
                             torch.nn.Linear(37, 5)).eval()
_X = torch.randn(7, 23)


def _mod():
    from tvm_roller.integrations.pytorch import import_torch

    return import_torch(_MODEL, _X)


def _files(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _check_runs(ex) -> None:
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(_X.numpy()))
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    with torch.no_grad():
        want = _MODEL(_X).double().numpy()
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_cache_false_reads_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_ROLLER_CACHE", str(tmp_path))
    report: list = []
    ex = tvm_roller.relax.compile(_mod(), TARGET, report, device(), cache=False)
    _check_runs(ex)
    assert any(e["status"] == "roller" for e in report)
    assert _files(tmp_path) == []
    # the pass and the pipeline alone, given a target: the same
    with tvm.transform.PassContext(opt_level=3):
        tvm.compile(_mod(), target=tvm.target.Target(TARGET), relax_pipeline=
                    tvm_roller.relax.get_pipeline(TARGET, [], device(), cache=False))
    assert _files(tmp_path) == []


def test_a_passed_schedule_cache_receives_the_tiles(tmp_path, monkeypatch):
    default = tmp_path / "default"
    monkeypatch.setenv("TVM_ROLLER_CACHE", str(default))
    mine = ScheduleCache(tmp_path / "mine" / "schedules")
    tvm_roller.relax.compile(_mod(), TARGET, [], device(), cache=mine)
    assert mine.stats()["writes"] >= 2
    assert any(f.endswith(".json") for f in _files(tmp_path / "mine" / "schedules"))
    assert _files(tmp_path / "mine" / "modules")  # the module cache sits beside it
    assert not default.exists() or _files(default) == []


def test_a_context_keeps_its_options_through_the_pipeline(tmp_path, monkeypatch):
    """get_pipeline / schedule_pass given a Context read its cache (none here) and options; an
    option given beside it changes it."""
    monkeypatch.setenv("TVM_ROLLER_CACHE", str(tmp_path))
    ctx = Context.make(TARGET, device(), cache=False, fast_math=False)
    report: list = []
    with tvm.transform.PassContext(opt_level=3):
        tvm.compile(_mod(), target=ctx.target,
                    relax_pipeline=tvm_roller.relax.get_pipeline(ctx, report))
    assert report and _files(tmp_path) == []
    mine = ScheduleCache(tmp_path / "s")
    tvm_roller.relax.schedule_pass(ctx, cache=mine)  # given: changes the pass's context only
    assert ctx.cache is None


def test_context_options_are_checked_and_converted():
    ctx = Context.make(TARGET, device(), cache=True, measure_topk=3, buckets={"n": [64, 16]})
    assert isinstance(ctx.cache, ScheduleCache) and ctx.measure.topk == 3
    assert ctx.buckets == {"n": (16, 64)}
    assert ctx.with_options(measure_topk=0).measure is None
    assert str(ctx.runtime_device()) == str(tvm.cpu())
    with pytest.raises(TypeError, match="unknown Context option"):
        ctx.with_options(fastmath=True)
    with pytest.raises(TypeError, match="with_options"):
        Context.make(ctx)
    with pytest.raises(TypeError, match="ScheduleCache"):
        Context.make(TARGET, device(), cache="yes")


def test_meta_schedule_candidates_have_a_report_entry(tmp_path):
    """MetaSchedule's records come through the planner's one path: each task has a report
    entry, the decline included (typed reason), and the records replay."""
    import warnings

    from tvm_roller import meta_schedule as rms

    report: list = []
    rms.tune(matmul_func(37, 29, 61), TARGET, tmp_path / "mm", topk=2, report=report,
             device=device())
    assert len(report) == 1 and report[0]["status"] == "roller" and report[0]["rtile"]
    assert report[0]["bound_s"] and report[0]["predicted_s"] > 0
    declined: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rms.tune(gather_sum_func(), TARGET, tmp_path / "g", report=declined, device=device())
    assert declined[0]["status"] == "fallback" and declined[0]["fallback"] == "decline"
    assert "gather" in declined[0]["reason"]
    assert rms.read_manifest(tmp_path / "g")["declined"][0]["reason"] == declined[0]["reason"]
