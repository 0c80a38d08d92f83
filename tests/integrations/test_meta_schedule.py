"""tvm_roller.meta_schedule: roller's schedules as MetaSchedule tuning records.

Records go through TVM's own consumers unchanged (``compile_tir``, ``MetaScheduleApplyDatabase``)
and the kernels they produce are checked against float64 numpy on random data, odd shapes.
"""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, te
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

import tvm_roller
from tvm_roller import UnsupportedError
from tvm_roller import meta_schedule as rms

from conftest import F32_TOL, F32_TOL_LONG, TARGET, assert_close, device, rand, run

TGT = tvm.target.Target(TARGET)


def _matmul_bias_relu(m: int, n: int, k: int) -> tvm.tirx.PrimFunc:
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    bias = te.placeholder((n,), name="bias")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    d = te.compute((m, n), lambda i, j: te.max(c[i, j] + bias[j], 0.0), name="D")
    return te.create_prim_func([a, b, bias, d])


def _matmul_ref(a, b, bias):
    return np.maximum(a @ b + bias, 0.0)


def _run_schedule(sch, m: int, n: int, k: int, seed: int = 0) -> None:
    lib = tvm.compile(sch.mod, target=TGT)
    a, b, bias = rand((m, k), seed=seed), rand((k, n), seed=seed + 1), rand((n,), seed=seed + 2)
    out = run(lib["main"], [a, b, bias], (m, n), "float32")
    tol = F32_TOL_LONG if k > 256 else F32_TOL
    assert_close(out, _matmul_ref(a.astype("f8"), b.astype("f8"), bias.astype("f8")), tol)


def _lines(work_dir) -> int:
    path = os.path.join(work_dir, "database_tuning_record.json")
    with open(path, encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


# -- fake builder / runner: measured-database semantics without processes --------------------------
@derived_object
class _FakeBuilder(ms.builder.PyBuilder):
    """Succeeds except for the inputs whose index is in ``fail``."""

    def __init__(self, fail=()):
        super().__init__()
        self.fail = set(fail)

    def build(self, build_inputs):
        return [ms.builder.BuilderResult(None, "injected build failure") if i in self.fail
                else ms.builder.BuilderResult(f"/nonexistent/artifact{i}.tar", None)
                for i in range(len(build_inputs))]


@derived_object
class _FakeRunner(ms.runner.PyRunner):
    """Reports ``secs[i]`` for the i-th input; None means a failed run."""

    def __init__(self, secs):
        super().__init__()
        self.secs = list(secs)

    def run(self, runner_inputs):
        out = []
        for i, _ in enumerate(runner_inputs):
            s = self.secs[i]
            res = (ms.runner.RunnerResult(None, "injected run failure") if s is None
                   else ms.runner.RunnerResult([s, s], None))
            out.append(ms.runner.RunnerFuture(f_done=lambda: True, f_result=lambda r=res: r))
        return out


# -- TIR: the database round-trips through compile_tir ---------------------------------------------
def test_predicted_records_compile_through_compile_tir(tmp_path):
    m, n, k = 37, 53, 61
    func = _matmul_bias_relu(m, n, k)
    wd = tmp_path / "db"
    db = rms.tune(func, TARGET, wd, topk=3, device=device())
    assert isinstance(db, ms.database.JSONDatabase)

    man = rms.read_manifest(wd)
    assert man["run_secs"] == rms.PREDICTED
    assert man["declined"] == [] and man["failed"] == []
    plan = tvm_roller.plan(func, TARGET, topk=3, device=device())
    assert [s["predicted_s"] for s in man["seeds"]] == [t.predicted_s for t in plan.tiles]
    assert [s["run_secs"] for s in man["seeds"]] == [[t.predicted_s] for t in plan.tiles]
    assert _lines(wd) == len(plan.tiles)

    # a fresh database object reads the files back; TVM's compile_tir picks the best record
    sch = ms.tir_integration.compile_tir(ms.database.JSONDatabase(work_dir=str(wd)), func, TGT)
    assert sch is not None
    best = tvm_roller.planner.apply(plan, plan.tiles[0])
    assert [list(map(int, d)) for d in sch.trace.decisions.values()] == \
        [list(map(int, d)) for d in best.trace.decisions.values()]
    _run_schedule(sch, m, n, k)


def test_records_match_tune_tir_workload_keys(tmp_path):
    # MetaSchedule keys a task by its normalised module: a PrimFunc given bare and one inside an
    # IRModule must hit the same workload, and so must the normalisation compile_tir does
    func = _matmul_bias_relu(19, 33, 17)
    wd = tmp_path / "db"
    rms.tune(tvm.IRModule({"main": func}), TARGET, wd, device=device())
    db = ms.database.JSONDatabase(work_dir=str(wd))
    normalized = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")(func)
    assert db.has_workload(normalized)
    assert len(db.get_all_tuning_records()) == 1
    _run_schedule(ms.tir_integration.compile_tir(db, func, TGT), 19, 33, 17, seed=3)


# -- predicted and measured never mix --------------------------------------------------------------
def test_predicted_database_is_marked_and_refuses_measured_records(tmp_path):
    func = _matmul_bias_relu(23, 29, 31)
    wd = tmp_path / "pred"
    rms.tune(func, TARGET, wd, topk=2, device=device())
    assert rms.read_manifest(wd)["run_secs"] == "predicted"
    with open(wd / rms.MANIFEST, encoding="utf-8") as fh:
        assert json.load(fh)["run_secs"] == "predicted"
    before = _lines(wd)
    with pytest.raises(ValueError, match="predicted"):
        rms.tune(func, TARGET, wd, measure=True, builder=_FakeBuilder(),
                 runner=_FakeRunner([1e-3, 1e-3]), device=device())
    with pytest.raises(ValueError, match="predicted"):
        rms.tune_seeded(func, TARGET, wd, max_trials=4, builder=_FakeBuilder(),
                        runner=_FakeRunner([1e-3] * 4), device=device())
    assert _lines(wd) == before  # nothing was added
    # more predicted records for the same target are fine
    rms.tune(_matmul_bias_relu(7, 9, 11), TARGET, wd, device=device())
    assert _lines(wd) == before + 1


def test_measured_database_refuses_predicted_records(tmp_path):
    func = _matmul_bias_relu(23, 29, 31)
    wd = tmp_path / "meas"
    rms.tune(func, TARGET, wd, topk=2, measure=True, builder=_FakeBuilder(),
             runner=_FakeRunner([2e-3, 1e-3]), device=device())
    man = rms.read_manifest(wd)
    assert man["run_secs"] == "measured"
    assert [s["run_secs"] for s in man["seeds"]] == [[2e-3, 2e-3], [1e-3, 1e-3]]
    with pytest.raises(ValueError, match="measured"):
        rms.tune(func, TARGET, wd, device=device())
    # MetaSchedule ranks by the measured times: rank #1 (1 ms) beats rank #0 (2 ms)
    db = ms.database.JSONDatabase(work_dir=str(wd))
    rec = db.query_tuning_record(tvm.IRModule({"main": func}), TGT, "main")
    assert [float(s) for s in rec.run_secs] == [1e-3, 1e-3]


def test_metaschedule_database_refuses_predicted_records(tmp_path):
    # a database written by MetaSchedule itself (no manifest) holds measured times
    func = _matmul_bias_relu(16, 16, 16)
    wd = tmp_path / "ms"
    os.makedirs(wd)
    db = ms.database.JSONDatabase(work_dir=str(wd))
    mod = tvm.IRModule({"main": func})
    wl = db.commit_workload(mod)
    db.commit_tuning_record(ms.database.TuningRecord(
        tvm.s_tir.Schedule(mod).trace, wl, run_secs=[1e-3], target=TGT,
        args_info=ms.arg_info.ArgInfo.from_prim_func(func)))
    with pytest.raises(ValueError, match="measured"):
        rms.tune(func, TARGET, wd, device=device())
    # measured records may join it
    rms.tune(func, TARGET, wd, measure=True, builder=_FakeBuilder(), runner=_FakeRunner([5e-4]),
             device=device())
    assert _lines(wd) == 2


def test_other_target_refused(tmp_path):
    func = _matmul_bias_relu(16, 16, 16)
    wd = tmp_path / "db"
    rms.tune(func, TARGET, wd, device=device())
    other = dict(TARGET, mcpu="znver4")
    with pytest.raises(ValueError, match="target"):
        rms.tune(func, other, wd, device=device())


# -- measure=True: MetaSchedule's own builder and runner -------------------------------------------
def test_measure_records_measured_times(tmp_path):
    m, n, k = 45, 67, 39
    func = _matmul_bias_relu(m, n, k)
    wd = tmp_path / "db"
    config = ms.runner.EvaluatorConfig(number=2, repeat=2, min_repeat_ms=5)
    rms.tune(func, TARGET, wd, topk=2, measure=True, device=device(),
             runner=ms.runner.LocalRunner(timeout_sec=60, evaluator_config=config))
    man = rms.read_manifest(wd)
    assert man["run_secs"] == "measured" and man["failed"] == []
    assert len(man["seeds"]) == 2
    for seed in man["seeds"]:
        assert len(seed["run_secs"]) == 2 and all(0 < s < 0.1 for s in seed["run_secs"])
        assert seed["run_secs"] != [seed["predicted_s"]] * 2
    recs = rms.trial_records(wd)
    assert [r.run_secs for r in recs] == [s["run_secs"] for s in man["seeds"]]
    _run_schedule(ms.tir_integration.compile_tir(ms.database.JSONDatabase(work_dir=str(wd)),
                                                 func, TGT), m, n, k, seed=5)


def test_failed_builds_and_runs_are_reported_not_recorded(tmp_path, caplog):
    func = _matmul_bias_relu(37, 53, 61)  # three candidates
    wd = tmp_path / "db"
    with caplog.at_level(logging.WARNING, logger="tvm_roller.meta_schedule"):
        rms.tune(func, TARGET, wd, topk=3, measure=True, builder=_FakeBuilder(fail=[0]),
                 runner=_FakeRunner([None, 3e-4]), device=device())
    man = rms.read_manifest(wd)
    assert [(f["rank"], f["stage"]) for f in man["failed"]] == [(0, "build"), (1, "run")]
    assert [s["rank"] for s in man["seeds"]] == [2]
    assert _lines(wd) == 1
    assert "build of main #0 failed" in caplog.text and "run of main #1 failed" in caplog.text


# -- declined functions ----------------------------------------------------------------------------
def test_declined_functions_are_reported(tmp_path, caplog):
    x = te.placeholder((33, 65), name="X")
    y = te.compute((33, 65), lambda i, j: te.exp(x[i, j]) * 2.0, name="Y")
    ok = te.create_prim_func([x, y]).with_attr("global_symbol", "scale_exp")
    nv = te.var("n")
    xd = te.placeholder((nv, 8), name="X")
    yd = te.compute((nv, 8), lambda i, j: xd[i, j] + 1.0, name="Y")
    dyn = te.create_prim_func([xd, yd]).with_attr("global_symbol", "dyn_add")
    mod = tvm.IRModule({"scale_exp": ok, "dyn_add": dyn})
    wd = tmp_path / "db"
    with caplog.at_level(logging.WARNING, logger="tvm_roller.meta_schedule"):
        db = rms.tune(mod, TARGET, wd, device=device())
    man = rms.read_manifest(wd)
    assert [d["name"] for d in man["declined"]] == ["dyn_add"]
    assert man["declined"][0]["reason"]
    assert [s["task"] for s in man["seeds"]] == ["scale_exp"]
    assert "roller declined dyn_add" in caplog.text
    # the handled function compiles from the database
    sch = ms.tir_integration.compile_tir(db, ok, TGT)
    lib = tvm.compile(sch.mod, target=TGT)
    a = rand((33, 65))
    assert_close(run(lib["scale_exp"], [a], (33, 65), "float32"),
                 np.exp(a.astype("f8")) * 2.0, F32_TOL)


def test_bad_inputs(tmp_path):
    func = _matmul_bias_relu(8, 8, 8)
    with pytest.raises(UnsupportedError, match="rocm"):
        rms.tune(func, {"kind": "rocm"}, tmp_path / "a")
    with pytest.raises(UnsupportedError, match="compute capability"):
        rms.tune(func, {"kind": "cuda", "arch": "sm_86"}, tmp_path / "a2")
    with pytest.raises(ValueError, match="parent"):
        rms.tune(func, TARGET, tmp_path / "missing" / "db", device=device())
    with pytest.raises(ValueError, match="topk"):
        rms.tune(func, TARGET, tmp_path / "b", topk=0, device=device())
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        rms.tune(func, TARGET, tmp_path / "file", device=device())
    with pytest.raises(UnsupportedError, match="PrimFunc"):
        rms.tune("not a module", TARGET, tmp_path / "c", device=device())
    with pytest.raises(ValueError, match="max_trials"):
        rms.tune_seeded(func, TARGET, tmp_path / "d", max_trials=0, device=device())
    assert not (tmp_path / "missing").exists()


# -- Relax: tasks of the fused module, applied by MetaScheduleApplyDatabase ------------------------
def test_relax_mlp_records_apply_through_metaschedule_apply_database(tmp_path):
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self):
            self.fc1 = nn.Linear(37, 45)
            self.fc2 = nn.Linear(45, 11)

        def forward(self, x):
            return self.fc2(nn.relu(self.fc1(x)))

    mod, named = MLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor((13, 37), "float32")}})
    wd = tmp_path / "db"
    db = rms.tune(mod, TARGET, wd, device=device())
    man = rms.read_manifest(wd)
    assert man["declined"] == [] and man["failed"] == []

    # the tasks are the PrimFuncs of fusion_passes()(mod), the same ones MetaSchedule extracts
    fused = rms.fused_module(mod, TGT)
    ms_tasks = ms.relax_integration.extract_tasks(fused, TGT)
    ours = rms.extract_tasks(mod, TGT)
    assert sorted(t.task_name for t in ms_tasks) == sorted(t.name for t in ours)
    for t in ms_tasks:
        assert any(tvm_ffi.structural_equal(t.dispatched[0], o.workload) for o in ours)
    assert sorted(s["task"] for s in man["seeds"]) == sorted(t.name for t in ours)

    from tvm_roller.relax import fusion_passes

    with TGT, db:  # MetaScheduleApplyDatabase must be constructed under the target
        applied = tvm.transform.Sequential([
            fusion_passes(), relax.transform.MetaScheduleApplyDatabase(enable_warning=True)])(mod)
        prims = [f for _, f in applied.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        assert prims and all(f.attrs.get("tirx.is_scheduled", False) for f in prims)
        ex = tvm.compile(mod, TGT, relax_pipeline=tvm.transform.Sequential([
            fusion_passes(), relax.transform.MetaScheduleApplyDatabase(),
            relax.get_pipeline("default_build")]))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = rand((13, 37), seed=7)
    ws = {name: rand([int(s) for s in p.shape], seed=11 + i) for i, (name, p) in enumerate(named)}
    out = vm["forward"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(ws[n]) for n, _ in named])
    w = {k: v.astype("f8") for k, v in ws.items()}
    h = np.maximum(x.astype("f8") @ w["fc1.weight"].T + w["fc1.bias"], 0.0)
    assert_close(out.numpy(), h @ w["fc2.weight"].T + w["fc2.bias"], F32_TOL)


# -- warm start helpers ----------------------------------------------------------------------------
def test_seed_descendants_finds_mutated_tile_sizes(tmp_path):
    func = _matmul_bias_relu(48, 64, 40)
    wd = tmp_path / "db"
    db = rms.tune(func, TARGET, wd, measure=True, builder=_FakeBuilder(),
                  runner=_FakeRunner([1e-3]), device=device())
    seed = rms.trial_records(wd)[0]
    # what MutateTileSize does: move a factor between two positions of one tile decision
    plan = tvm_roller.plan(func, TARGET, device=device())
    sch = tvm_roller.planner.apply(plan, plan.tiles[0])
    insts, decisions = sch.trace.as_json()
    idx, dec = next((int(i), list(d)) for i, d in decisions
                    if insts[int(i)][0] == "SamplePerfectTile" and max(d) > 1)
    src = next(j for j, f in enumerate(dec) if f > 1 and f % 2 == 0)
    dst = (src + 1) % len(dec)
    new = list(dec)
    new[src] //= 2
    new[dst] *= 2
    mutated = tvm.s_tir.Schedule(db.commit_workload(tvm.IRModule({"main": func})).mod)
    tvm.s_tir.Trace.apply_json_to_schedule(
        [insts, [[int(i), new if int(i) == idx else d] for i, d in decisions]], mutated)
    wl = db.commit_workload(tvm.IRModule({"main": func}))
    db.commit_tuning_record(ms.database.TuningRecord(mutated.trace, wl, run_secs=[5e-4],
                                                     target=TGT))
    # the seed measured again unchanged is not a descendant, nor is an unrelated record
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, run_secs=[1.1e-3],
                                                     target=TGT))
    db.commit_tuning_record(ms.database.TuningRecord(tvm.s_tir.Schedule(wl.mod).trace, wl,
                                                     run_secs=[9e-4], target=TGT))
    found = rms.seed_descendants(wd)
    assert len(found) == 1
    assert found[0]["trial"] == 1 and found[0]["seed"] == seed.index
    assert found[0]["changed"] == {idx: (dec, new)}
    assert found[0]["mean_s"] == pytest.approx(5e-4)


def test_replay_checked_mutator_rejects_traces_that_do_not_replay():
    mod = tvm.IRModule({"main": _matmul_bias_relu(32, 32, 32)})
    sch = tvm.s_tir.Schedule(mod)
    i = sch.get_loops(sch.get_sblock("C"))[0]
    sch.split(i, sch.sample_perfect_tile(i, n=2, decision=[4, 8]))

    @derived_object
    class _Fixed(ms.mutator.PyMutator):
        """Always "mutates" into the same trace."""

        def __init__(self, out):
            self.out = out

        def _initialize_with_tune_context(self, context):
            pass

        def apply(self, trace, _):
            return self.out

        def clone(self):
            return _Fixed(self.out)

    checked = rms.ReplayCheckedMutator(_Fixed(sch.trace))
    checked.mod = mod
    assert checked.apply(sch.trace) is not None
    assert checked.stats == {"mutated": 1, "rejected": 0}
    # on a workload without block "C" the trace doesn't replay, which would abort a tune_tir
    # run; the checked mutator reports a failed mutation instead
    x = te.placeholder((32, 32), name="X")
    checked.mod = tvm.IRModule({"main": te.create_prim_func(
        [x, te.compute((32, 32), lambda a, b: x[a, b] + 1.0, name="Y")])})
    assert checked.apply(sch.trace) is None
    assert checked.stats == {"mutated": 2, "rejected": 1}
    assert checked._inst.clone().stats is checked.stats  # clones count into the same stats


@pytest.mark.slow
def test_seeded_tune_starts_from_roller_records(tmp_path):
    # ~60 s: TuneContext imports tvm.s_tir.tensor_intrin (~30 s) before the first trial
    m, n, k = 48, 64, 40
    func = _matmul_bias_relu(m, n, k)
    wd = tmp_path / "db"
    rms.tune_seeded(func, TARGET, wd, max_trials=8, topk=2, num_trials_per_iter=8, seed=1,
                    device=device())
    man = rms.read_manifest(wd)
    assert man["run_secs"] == "measured"
    recs = rms.trial_records(wd)
    seeds = [s["line"] for s in man["seeds"]]
    assert seeds == list(range(len(seeds))) and len(seeds) >= 1  # roller's records come first
    assert len(recs) == len(seeds) + 8  # then MetaSchedule's trials
    ms_recs = recs[len(seeds):]
    assert all(r.mean_s < 1 for r in ms_recs)
    # MetaSchedule's trials are its own samples or mutations of roller's records
    assert any(r.signature != recs[0].signature for r in ms_recs)
    _run_schedule(ms.tir_integration.compile_tir(ms.database.JSONDatabase(work_dir=str(wd)),
                                                 func, TGT), m, n, k, seed=9)


@pytest.mark.slow
def test_measure_through_rpc_runner(tmp_path):
    # a remote device is measured by TVM's own RPC: a tracker and a server on localhost here
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    m, n, k = 33, 47, 29
    func = _matmul_bias_relu(m, n, k)
    tracker = Tracker(host="127.0.0.1", port=9190, port_end=9290, silent=True)
    server = Server(host="127.0.0.1", port=9090, port_end=9190, key="roller-test",
                    tracker_addr=(tracker.host, tracker.port), silent=True)
    try:
        runner = ms.runner.RPCRunner(
            rpc_config=ms.runner.RPCConfig(tracker_host=tracker.host, tracker_port=tracker.port,
                                           tracker_key="roller-test", session_timeout_sec=60),
            evaluator_config=ms.runner.EvaluatorConfig(number=2, repeat=2, min_repeat_ms=5),
            max_workers=1)
        wd = tmp_path / "db"
        rms.tune(func, TARGET, wd, topk=1, measure=True, runner=runner, device=device())
    finally:
        server.terminate()
        tracker.terminate()
    man = rms.read_manifest(wd)
    assert man["failed"] == [] and len(man["seeds"]) == 1
    assert len(man["seeds"][0]["run_secs"]) == 2 and all(s > 0 for s in man["seeds"][0]["run_secs"])
    _run_schedule(ms.tir_integration.compile_tir(ms.database.JSONDatabase(work_dir=str(wd)),
                                                 func, TGT), m, n, k, seed=13)
