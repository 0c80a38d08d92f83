"""Stored suite runs and their comparison (tvm_roller.tools.suite.runs / compare): the flagging
threshold, machine-class and target mismatches, workloads missing on either side, the file
round trip, and records made from the runner's rounds. Pure: nothing is built or timed."""
from __future__ import annotations

import json
import statistics

import pytest

from tvm_roller.tools.suite import compare, runs
from tvm_roller.tools.suite.runs import MachineClass, SuiteRun, WorkloadTiming

XEON = MachineClass("Intel(R) Xeon(R) Processor", 2)
TARGET = '{"kind":"llvm","num-cores":2,"mcpu":"emeraldrapids"}'


def _wl(ratio, ok=True, roller=1e-4):
    if ratio is None:
        return WorkloadTiming(ok=ok, roller_s=roller if ok else None, torch_s=None, ratio=None,
                              error=None if ok else "run: RuntimeError: boom")
    return WorkloadTiming(ok=ok, roller_s=roller, torch_s=roller * ratio, ratio=ratio,
                          roller_runs_s=[roller] * 3, torch_runs_s=[roller * ratio] * 3)


def _run(wls, machine=XEON, target=TARGET):
    return SuiteRun(machine=machine, target=target, date="2026-12-04T00:00:00+00:00",
                    git_commit="0123456789abcdef", git_dirty=False, version="0.1.1", rounds=3,
                    repeat=5, workloads=wls)


def test_threshold_flags_only_more_than_15_percent_worse():
    stored = _run({"GMM:0": _wl(2.0), "GMM:1": _wl(2.0), "C3D:3": _wl(0.5), "SFM:0": _wl(2.0)})
    now = _run({"GMM:0": _wl(1.71),  # 0.855: inside the band
                "GMM:1": _wl(1.69),  # 0.845: flagged
                "C3D:3": _wl(0.9),  # better: never flagged
                "SFM:0": _wl(1.7)})  # exactly 0.85 is not "more than 15% worse"
    c = compare.compare_runs(stored, now)
    flags = {r.workload: r.flag for r in c.rows}
    assert flags == {"GMM:0": "", "GMM:1": compare.SLOWER, "C3D:3": "", "SFM:0": ""}
    assert [r.workload for r in c.flagged] == ["GMM:1"]
    row = {r.workload: r for r in c.rows}["GMM:1"]
    assert row.stored == 2.0 and row.now == 1.69 and row.change == pytest.approx(0.845)
    assert c.class_geomean["GMM"] == pytest.approx((0.855 * 0.845) ** 0.5)
    assert c.class_geomean["C3D"] == pytest.approx(1.8)
    assert c.geomean == pytest.approx((0.855 * 0.845 * 1.8 * 0.85) ** 0.25)
    text = compare.format_comparison(c, stored)
    assert "GMM:1" in text and "SLOWER" in text and "1 flagged: GMM:1" in text
    assert "geomean change per class: GMM 0.850, C3D 1.800, SFM 0.850" in text
    # a stricter threshold flags more
    assert len(compare.compare_runs(stored, now, threshold=0.9).flagged) == 3


def test_failures_and_missing_workloads():
    stored = _run({"GMM:0": _wl(1.0), "GMM:1": _wl(1.0), "NRM:0": _wl(None, ok=False),
                   "DEP:0": _wl(None, ok=False), "TBG:0": _wl(1.0)})
    now = _run({"GMM:0": _wl(None, ok=False),  # passed then, fails now: flagged
                "GMM:1": _wl(None),  # ok, but PyTorch's time missing: not comparable
                "NRM:0": _wl(0.5),  # failed then: nothing to compare with
                "DEP:0": _wl(None, ok=False),  # failed in both: the suite's own status says so
                "CAP:1": _wl(1.0)})  # not in the stored run
    c = compare.compare_runs(stored, now)
    rows = {r.workload: r for r in c.rows}
    assert rows["GMM:0"].flag == compare.FAILED and "boom" in rows["GMM:0"].note
    assert [r.workload for r in c.flagged] == ["GMM:0"]
    assert rows["GMM:1"].change is None and rows["GMM:1"].note == "no ratio in one run"
    assert rows["NRM:0"].change is None and not rows["NRM:0"].flag
    assert rows["DEP:0"].note == "failed in both runs"
    assert rows["CAP:1"].stored is None and rows["CAP:1"].note == "not in the stored run"
    assert c.not_run == ["TBG:0"]  # a run of some workloads is no regression in the others
    assert c.geomean is None and c.class_geomean == {"GMM": None, "NRM": None, "DEP": None,
                                                     "CAP": None}
    assert "1 stored workloads not run now" in compare.format_comparison(c, stored)


def test_machine_class_and_target_mismatch():
    stored = _run({"GMM:0": _wl(1.0)})
    assert compare.mismatch(stored, XEON, TARGET) is None
    assert compare.mismatch(stored, XEON, None) is None  # target unknown: not compared
    zen = MachineClass("AMD Ryzen 9 7950X 16-Core Processor", 2)
    assert "CPU model" in compare.mismatch(stored, zen, TARGET)
    why = compare.mismatch(stored, MachineClass(XEON.cpu_model, 4), TARGET)
    assert why == "2 CPUs (stored) vs 4 (here)"
    assert "target" in compare.mismatch(stored, XEON, TARGET.replace("2", "1"))


def test_cpu_model_and_slug():
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R)  Xeon(R) Processor\n"
    assert runs.cpu_model_name(text) == "Intel(R) Xeon(R) Processor"
    assert runs.cpu_model_name(None)  # no /proc/cpuinfo: the platform's name
    assert XEON.slug() == "intel-r-xeon-r-processor-2cpu"
    assert MachineClass("AMD Ryzen 9 7950X 16-Core Processor", 32).slug() == \
        "amd-ryzen-9-7950x-16-core-processor-32cpu"
    here = runs.host_machine()
    assert here.cpus >= 1 and here.cpu_model


def test_file_round_trip_and_bad_files(tmp_path):
    run = _run({"GMM:0": _wl(1.25), "NRM:0": _wl(None, ok=False)})
    path = runs.save_run(run, tmp_path / "sub" / "run.json")
    assert json.loads(path.read_text())["format"] == runs.FORMAT
    assert runs.load_run(path) == run
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="not a stored suite run"):
        runs.load_run(tmp_path / "list.json")
    (tmp_path / "bad.json").write_text(json.dumps({"format": runs.FORMAT, "machine": {}}))
    with pytest.raises(ValueError, match="malformed"):
        runs.load_run(tmp_path / "bad.json")
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(ValueError, match="not JSON"):
        runs.load_run(tmp_path / "text.json")
    with pytest.raises(OSError):
        runs.load_run(tmp_path / "absent.json")


def test_shipped_path(monkeypatch, tmp_path):
    monkeypatch.setattr(runs, "DATA_DIR", tmp_path)
    monkeypatch.setattr(runs, "host_machine", lambda: XEON)
    assert runs.resolve_path("other.json").name == "other.json"
    with pytest.raises(ValueError, match="no shipped run for this machine class"):
        runs.resolve_path(runs.SHIPPED)
    runs.save_run(_run({}), tmp_path / f"{XEON.slug()}.json")
    assert runs.resolve_path(runs.SHIPPED) == tmp_path / "intel-r-xeon-r-processor-2cpu.json"


def test_record_from_runner_rounds():
    rec = {"workload": "GMM:0", "ok": True, "error": None, "load_avg": 0.3,
           "latency_runs_s": [1.0e-4, 2.0e-4, 1.1e-4], "torch_runs_s": [2.0e-4, 2.2e-4, 3.3e-4]}
    wl = runs.workload_timing(rec)
    assert wl.roller_s == pytest.approx(1.1e-4) and wl.torch_s == pytest.approx(2.2e-4)
    # the median of the rounds' paired ratios (2.0, 1.1, 3.0), not a ratio of medians
    assert wl.ratio == pytest.approx(2.0)
    assert wl.ratio == pytest.approx(statistics.median([2.0, 1.1, 3.0]))
    failed = runs.workload_timing({**rec, "ok": False, "error": "wrong result"})
    assert failed.ratio is None and failed.error == "wrong result"
    run = runs.make_run([rec], TARGET, rounds=3, repeat=5)
    assert run.machine == runs.host_machine() and run.target == TARGET
    assert list(run.workloads) == ["GMM:0"] and run.rounds == 3
    assert run.version == __import__("tvm_roller").__version__


def test_plan_change_is_noted():
    """A changed plan digest is said beside the ratio (flagged or not); an unknown one is not."""
    def planned(ratio, plan):
        wl = _wl(ratio)
        wl.plan = plan
        return wl

    stored = _run({"GMM:0": planned(1.0, "aaa"), "GMM:1": planned(1.0, "bbb"),
                   "GMM:2": planned(1.0, None)})
    now = _run({"GMM:0": planned(0.5, "ccc"), "GMM:1": planned(1.0, "bbb"),
                "GMM:2": planned(1.0, "ddd")})
    rows = {r.workload: r for r in compare.compare_runs(stored, now).rows}
    assert rows["GMM:0"].flag == compare.SLOWER
    assert rows["GMM:0"].note == "plan changed; time now / stored: roller x1.00, torch x0.50"
    assert rows["GMM:1"].note == "" and rows["GMM:2"].note == ""
    text = compare.format_comparison(compare.compare_runs(stored, now), stored)
    assert "SLOWER (plan changed; time now / stored: roller x1.00, torch x0.50)" in text


def test_busy_machine_is_noted():
    """Other processes' share of the CPUs while either run timed a workload is said (> 10%)."""
    def busy(ratio, share):
        wl = _wl(ratio)
        wl.foreign_cpu = share
        return wl

    stored = _run({"GMM:0": busy(1.0, 0.02), "GMM:1": busy(1.0, 0.3), "GMM:2": busy(1.0, None)})
    now = _run({"GMM:0": busy(0.5, 0.45), "GMM:1": busy(1.0, 0.1), "GMM:2": busy(1.0, 0.05)})
    rows = {r.workload: r for r in compare.compare_runs(stored, now).rows}
    assert rows["GMM:0"].flag == compare.SLOWER
    assert rows["GMM:0"].note == ("time now / stored: roller x1.00, torch x0.50; "
                                  "now: other processes used 45% of the CPUs")
    assert rows["GMM:1"].note == "stored: other processes used 30% of the CPUs"
    assert rows["GMM:2"].note == ""


def test_a_flag_says_which_side_moved():
    """roller twice as slow with PyTorch unchanged reads differently from PyTorch twice as fast."""
    stored = _run({"GMM:0": _wl(2.0, roller=1e-4), "GMM:1": _wl(2.0, roller=1e-4)})
    now = _run({"GMM:0": _wl(1.0, roller=2e-4),  # torch 2e-4 both times: roller's regression
                "GMM:1": _wl(1.0, roller=1e-4)})  # torch 2e-4 -> 1e-4: PyTorch's
    rows = {r.workload: r for r in compare.compare_runs(stored, now).rows}
    assert rows["GMM:0"].note == "time now / stored: roller x2.00, torch x1.00"
    assert rows["GMM:1"].note == "time now / stored: roller x1.00, torch x0.50"
