"""The MetaSchedule baselines a fresh clone / install has: the records shipped in the package, the
search order (env var, re-tuned here, shipped, shared), the re-tune tool's writer, and the suite
naming the database its MS column came from."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tvm_roller
from tvm_roller.tools.suite import baselines, references, tune_baselines, workloads
from conftest import REPO_ROOT
from tvm_roller.hardware.cpu import host_cpu


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No env var, an empty cache and HOME, no shared/ beside the repository or the cwd."""
    monkeypatch.delenv(baselines.ENV_VAR, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TVM_ROLLER_CACHE", str(tmp_path / "cache"))
    # candidates() looks for ../shared relative to the module's file and the working directory
    monkeypatch.setattr(baselines, "__file__", str(tmp_path / "a" / "b" / "c" / "baselines.py"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _target(mcpu=None):
    import tvm

    return tvm.target.Target({"kind": "llvm",
                              "mcpu": mcpu or host_cpu(),
                              "num-cores": 2})


def _best(cls, idx=1):
    """The shipped best record of ``cls:idx`` and its module, as tune_one returns them."""
    import tvm

    db = baselines.database(baselines.SHIPPED_DIR)
    mod = tvm.IRModule({"main": workloads.create(cls, idx)})
    (best,) = db.get_top_k(db.commit_workload(mod), 1)
    return mod, best


def _line(cls, target, idx=1, tune_s=1.0):
    return {"op": cls, "idx": idx, "trials": 4, "tune_s": tune_s, "best_s": 1e-4,
            "target": tune_baselines.target_dict(target), "date": "2026-01-01T00:00:00+00:00"}


def test_shipped_database_is_package_data(isolated):
    pkg = Path(tvm_roller.__file__).resolve().parent
    assert baselines.SHIPPED_DIR.is_relative_to(pkg)
    for f in ("database_workload.json", "database_tuning_record.json", "tuning_times.jsonl",
              "README.md"):
        assert (baselines.SHIPPED_DIR / f).is_file(), f
    srcs = baselines.candidates(_target())
    assert [s.kind for s in srcs][:2] == ["retuned", "shipped"]
    assert not any(s.exists() for s in srcs if s.kind == "shared")  # no ../shared here
    src = baselines.find(_target())
    assert src.kind == "shipped" and src.path == baselines.SHIPPED_DIR
    assert baselines.tune_seconds("GMM", 1) == pytest.approx(326.509, rel=1e-4)
    assert {baselines.tuning_record(c, 1)["trials"] for c in workloads.CLASSES} == {192}
    info = baselines.source_info(_target())
    assert info["source"] == "shipped" and info["tuned_for"] == baselines.BASELINE_TARGET
    assert "shipped with tvm-roller" in baselines.compile_note(_target())


def test_packaging_lists_the_data():
    setup = (REPO_ROOT / "setup.py").read_text(encoding="utf-8")
    assert "package_data" in setup and "data/*/*.json" in setup and "data/*/*.jsonl" in setup
    assert "tvm_roller/tools/suite/data" in (REPO_ROOT / "MANIFEST.in").read_text(encoding="utf-8")


def test_shipped_schedule_builds_and_is_correct(isolated):
    import tvm

    tgt = _target()
    sch = baselines.tuned_schedule("GMM", 1, tgt)  # found with no env var and no shared/
    assert sch is not None
    assert baselines.tuned_schedule("GMM", 0, tgt) is None  # only shape 1 was tuned
    func = workloads.create("GMM", 1)
    inputs = workloads.random_inputs(func, seed=3)
    ex = tvm.compile(sch.mod, tgt)
    dev = tvm.cpu(0)
    out = tvm.runtime.empty(*workloads.output_spec(func), dev)
    ex(*[tvm.runtime.tensor(x, dev) for x in inputs], out)
    ok, err = references.compare(out.numpy(), references.reference("GMM", 1, inputs))
    assert ok, err


def test_retuned_takes_precedence(isolated, monkeypatch):
    tgt = _target("haswell")  # an AVX2 CPU: re-tuned for it, usable on a host without AVX-512
    dest = baselines.retuned_dir(tgt)
    assert dest == isolated / "cache" / "baselines" / "metaschedule-llvm-haswell-2c"
    monkeypatch.setattr(baselines, "host_has_avx512", lambda: False)
    assert "AVX-512" in baselines.skip_reason(tgt)  # only the shipped skylake-avx512 records

    mod, best = _best("GMM")
    tune_baselines.write_records(dest, [(mod, best, _line("GMM", tgt, tune_s=5.0))])
    src = baselines.find(tgt)
    assert src.kind == "retuned" and src.path == dest
    assert baselines.skip_reason(tgt) is None
    assert baselines.source_info(tgt)["tuned_for"]["mcpu"] == "haswell"
    assert baselines.tune_seconds("GMM", 1, target=tgt) == 5.0
    assert baselines.tuned_schedule("GMM", 1, tgt) is not None
    assert baselines.tuned_schedule("C2D", 1, tgt) is None  # not re-tuned, not taken from shipped
    assert "re-tuned on this machine" in baselines.compile_note(tgt)
    # the shipped records stay the default for other targets
    assert baselines.find(_target("skylake-avx512")).kind == "shipped"

    # adding a workload keeps the others; re-tuning one replaces its record (one per workload)
    mod2, best2 = _best("NRM")
    tune_baselines.write_records(dest, [(mod2, best2, _line("NRM", tgt))])
    tune_baselines.write_records(dest, [(mod, best, _line("GMM", tgt, tune_s=7.0))])
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(dest), allow_missing=False)
    assert len(db.get_all_tuning_records()) == 2
    times = [json.loads(x) for x in (dest / "tuning_times.jsonl").read_text().splitlines()]
    assert sorted((t["op"], t["tune_s"]) for t in times) == [("GMM", 7.0), ("NRM", 1.0)]
    assert baselines.tune_seconds("GMM", 1, target=tgt) == 7.0  # cache cleared on write
    assert not [p for p in dest.iterdir() if p.name.startswith(".staging")]

    # $TVM_ROLLER_BASELINES comes first
    env_dir = isolated / "env-db"
    shutil.copytree(baselines.SHIPPED_DIR, env_dir)
    monkeypatch.setenv(baselines.ENV_VAR, str(env_dir))
    assert baselines.find(tgt).kind == "env" and baselines.find(tgt).path == env_dir


def test_suite_report_names_the_database(isolated, monkeypatch, capsys):
    """The header line and every JSON record say which database the MS column came from."""
    from tvm.s_tir import Schedule

    from tvm_roller.tools.suite.runner import run_suite

    monkeypatch.setattr(baselines, "host_has_avx512", lambda: True)
    tgt = _target()
    out_json = isolated / "suite.json"
    kw = dict(repeat=1, min_repeat_ms=1, _schedule=lambda f, t: Schedule(f),
              _normalize=lambda t: tgt)
    run_suite("NRM:1", json_out=str(out_json), **kw)
    text = capsys.readouterr().out
    assert f"shipped with tvm-roller (tuned on a 2-core Zen 4, 192 trials): " \
           f"{baselines.SHIPPED_DIR}" in text
    (rec,) = json.loads(out_json.read_text())
    assert rec["ms_database"]["source"] == "shipped"
    assert rec["ms_database"]["path"] == str(baselines.SHIPPED_DIR)
    assert rec["ms_tuned_s"] > 0 and rec["ms_ok"]

    mod, best = _best("NRM")
    dest = baselines.retuned_dir(tgt)
    tune_baselines.write_records(dest, [(mod, best, _line("NRM", tgt, tune_s=2.0))])
    run_suite("NRM:1", json_out=str(out_json), **kw)
    text = capsys.readouterr().out
    assert f"re-tuned on this machine: {dest}" in text
    (rec,) = json.loads(out_json.read_text())
    assert rec["ms_database"] == {"source": "retuned", "path": str(dest),
                                  "tuned_for": tune_baselines.target_dict(tgt)}
    assert rec["ms_tune_s"] == 2.0 and rec["ms_ok"]


def test_tune_ops_and_cli_validation(isolated):
    assert tune_baselines.parse_ops(None) == [(c, 1) for c in workloads.CLASSES]
    assert tune_baselines.parse_ops("") == tune_baselines.parse_ops(None)
    assert tune_baselines.parse_ops("C2D:1,gmm") == [("C2D", 1), ("GMM", 1)]
    assert tune_baselines.parse_ops("GMM:2") == [("GMM", 2)]
    with pytest.raises(ValueError, match="valid classes"):
        tune_baselines.tune_baselines("FOO")
    with pytest.raises(ValueError, match="llvm"):
        tune_baselines.tune_baselines("GMM", target={"kind": "cuda", "arch": "sm_90"})
    script = REPO_ROOT / "python" / "tune_baselines.py"
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "--trials" in proc.stdout and "--per-iter" in proc.stdout
    proc = subprocess.run([sys.executable, str(script), "--ops", "NOPE"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "valid classes" in proc.stderr
