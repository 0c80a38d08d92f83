"""`tvm-roller suite --save-run` then `--compare-to` end to end: a workload deliberately slowed
(its roller schedule replaced by TVM's unscheduled function, a real and much slower kernel) is
flagged with exit status 1; the other workload, untouched, is not flagged for its own time
(PyTorch's may move). Both runs time real kernels against PyTorch; nothing in the stored record
is edited."""
from __future__ import annotations

import json

import pytest

# GMM:0 (128^3) is slowed; NRM:0 is the untouched control. A 1-core target keeps PyTorch and the
# kernels single-threaded: a shared 2-core machine's load then disturbs both sides alike.
OPS = "GMM:0,NRM:0"
TARGET = json.dumps({"kind": "llvm", "num-cores": 1})
ARGS = ["suite", "--ops", OPS, "--target", TARGET, "--repeat", "3", "--rounds", "5"]
# the suite runs time kernels: under pytest-xdist no other test runs beside them
pytestmark = pytest.mark.alone


def _table(out: str) -> dict:
    """The comparison table's rows: workload -> (stored, now, change, flag, note)."""
    rows = {}
    for line in out.split("workload   stored")[-1].splitlines()[1:]:
        cells = line.split(maxsplit=4)
        if len(cells) >= 4 and cells[0] in OPS.split(","):
            tail = cells[4] if len(cells) > 4 else ""
            flag = tail.split()[0] if tail.startswith(("SLOWER", "FAILED")) else ""
            rows[cells[0]] = (float(cells[1]), float(cells[2]), float(cells[3]), flag,
                              tail[len(flag):].strip(" ()"))
    return rows


def _roller_change(note: str) -> float:
    """roller's time now / stored, from a flagged row's note ("… roller x1.00, torch x0.64")."""
    return float(note.split("roller x")[1].split(",")[0])


def _slow_gmm(monkeypatch) -> None:
    """roller's schedule for GMM:0 becomes TVM's unscheduled function; NRM:0 keeps roller's."""
    from tvm.s_tir import Schedule

    import tvm_roller
    from tvm_roller.tools.suite import workloads

    real, gmm = tvm_roller.schedule, workloads.output_spec(workloads.create("GMM", 0))

    def schedule(func, target, *args, **kwargs):
        if workloads.output_spec(func) == gmm:  # (1, 128, 128) float32: NRM:0's is (1,)
            return Schedule(func)
        return real(func, target, *args, **kwargs)

    monkeypatch.setattr(tvm_roller, "schedule", schedule)


def test_compare_flags_a_slowed_workload(tmp_path, monkeypatch, capsys):
    from tvm_roller.tools.cli import main
    from tvm_roller.tools.suite import runs

    stored = tmp_path / "run.json"
    assert main(ARGS + ["--save-run", str(stored)]) == 0
    run = runs.load_run(stored)
    assert list(run.workloads) == ["GMM:0", "NRM:0"] and run.rounds == 5
    assert run.machine == runs.host_machine() and '"num-cores":1' in run.target
    for wl in run.workloads.values():
        assert wl.ok and len(wl.roller_runs_s) == len(wl.torch_runs_s) == 5 and wl.ratio > 0
        assert len(wl.plan) == 12 and int(wl.plan, 16) >= 0  # the scheduled kernel's digest
    capsys.readouterr()

    _slow_gmm(monkeypatch)
    assert main(ARGS + ["--compare-to", str(stored)]) == 1
    rows = _table(capsys.readouterr().out)
    # the unscheduled kernel is another plan, and said to be
    assert rows["GMM:0"][2] < 0.2 and rows["GMM:0"][3] == "SLOWER", rows
    assert rows["GMM:0"][4].startswith("plan changed"), rows
    assert "plan changed" not in rows["NRM:0"][4], rows
    if rows["NRM:0"][3]:
        # Not the slowdown: NRM:0's kernel is unchanged. A shared machine's load can still move
        # one comparison of a 5 us kernel past 15%; a second comparison must then stay inside,
        # or be flagged for PyTorch's time alone (its own runs moved 1.5x between two runs once)
        assert main(ARGS + ["--compare-to", str(stored)]) == 1
        rows = _table(capsys.readouterr().out)
    if rows["NRM:0"][3]:
        assert _roller_change(rows["NRM:0"][4]) < 1 / 0.85, rows



def test_compare_refuses_another_machine_class(tmp_path, capsys):
    """A stored run of another CPU (or CPU count) is refused with status 2 before any work;
    --force compares it anyway."""
    from tvm_roller.tools.cli import main
    from tvm_roller.tools.suite import runs

    here = runs.host_machine()
    other = runs.SuiteRun(machine=runs.MachineClass("AMD Ryzen 9 7950X", here.cpus + 14),
                          target="llvm", date="2026-12-01T00:00:00+00:00", git_commit=None,
                          git_dirty=None, version="0.1.0", rounds=3, repeat=5,
                          workloads={"NRM:0": runs.WorkloadTiming(True, 1e-5, 1e-5, 1.0)})
    path = runs.save_run(other, tmp_path / "zen.json")
    assert main(["suite", "--ops", "NRM:0", "--compare-to", str(path)]) == 2
    err = capsys.readouterr().err
    assert "refusing to compare" in err and "AMD Ryzen 9 7950X" in err and "--force" in err
    assert main(["suite", "--ops", "NRM:0", "--rounds", "2", "--save-run",
                 str(tmp_path / "x.json")]) == 2
    assert "--rounds >= 3" in capsys.readouterr().err
    assert main(["suite", "--ops", "NRM:0", "--compare-to", str(tmp_path / "absent.json")]) == 2


@pytest.mark.parametrize("ratio, expect", [(1e-3, 0), (1e3, 1)])
def test_force_compares_across_classes(tmp_path, capsys, ratio, expect):
    """--force: the comparison runs; a stored ratio far below any real one flags nothing, one far
    above flags the workload."""
    from tvm_roller.tools.cli import main
    from tvm_roller.tools.suite import runs

    other = runs.SuiteRun(machine=runs.MachineClass("AMD Ryzen 9 7950X", 32), target="llvm",
                          date="2026-12-01T00:00:00+00:00", git_commit=None, git_dirty=None,
                          version="0.1.0", rounds=3, repeat=5,
                          workloads={"NRM:0": runs.WorkloadTiming(True, 1e-5, 1e-5, ratio)})
    path = runs.save_run(other, tmp_path / "zen.json")
    assert main(["suite", "--ops", "NRM:0", "--repeat", "1", "--compare-to", str(path),
                 "--force"]) == expect
    out = capsys.readouterr().out
    assert "warning: comparing across machine classes" in out
    assert ("1 flagged: NRM:0" in out) == bool(expect)
