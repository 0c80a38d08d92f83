"""The random-case harness (``harness.random_cases``): deterministic cases, a seeded sample
that must come out clean, and faults planted on purpose that it must catch and classify.

The sample runs each case in an isolated worker, as ``python/random_cases.py`` does; the CUDA
part needs nvcc (no GPU). ``-m slow`` runs a larger sample.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import tvm

from harness.cuda_check import CheckReport, KernelBundle, PtxasReport
from harness.cuda_check.build import KernelLaunch, KernelResources
from tvm_roller.hardware import gpu
from harness.random_cases import check_cuda, families, report, runner
from harness.random_cases.case import (CRASH, ERROR, FAILURES, HANG, OK, WRONG, Case,
                                       Result)

from conftest import REPO_ROOT

HAVE_NVCC = shutil.which("nvcc") is not None
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not on PATH")


def _failures(results):
    return [f"{r.outcome}: {r.case.label()} [{r.stage}] {r.message}"
            for r in results if r.outcome in FAILURES]


# -- (a) determinism -----------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_same_seed_same_cases(target):
    a = families.generate(7, 40, target)
    assert a == families.generate(7, 40, target)
    assert a != families.generate(8, 40, target)
    # case i does not depend on n: a failure from a big run re-runs alone
    assert families.generate(7, 13, target) == a[:13]
    # each block of len(families) cases holds every family of the target once (attention is
    # CPU only)
    names = families.family_names(target=target)
    assert ("attention" in names) == (target == "cpu")
    assert sorted(c.family for c in a[:len(names)]) == sorted(names)


def test_cases_round_trip_and_rebuild_identically():
    for case in families.generate(3, 32, "cuda"):
        assert Case.from_json(case.to_json()) == case
        json.dumps(case.params)  # ints and strings only
        assert all(isinstance(v, (int, str)) for v in case.params.values())
        again = Case.from_json(case.to_json())
        assert families.make_func(again).script() == families.make_func(case).script()
        # every float tensor in float64 (an argmax's index stays int32)
        assert all(str(t.dtype) in ("float64", "int32")
                   for t in families.build(case, "float64").tensors)
        assert str(families.build(case, "float64").tensors[0].dtype) == "float64"


def test_extents_and_dtypes_cover_the_awkward_ones():
    cases = families.generate(0, 320, "cuda")
    exts = [v for c in cases for k, v in c.params.items()
            if isinstance(v, int) and k in ("M", "N", "K", "CI", "CO", "B", "L", "H", "W", "C")]
    assert sum(e == 1 for e in exts) > 0.04 * len(exts)
    assert sum(e % 2 == 1 for e in exts) > 0.25 * len(exts)
    half = [c for c in cases if c.dtype == "float16"]
    assert any(c.params.get("acc") == "float32" for c in half if c.family == "matmul")
    assert {c.dtype for c in cases} == {"float16", "float32", "float64"}
    full = [c for c in cases if c.family == "reduce"
            and len(c.params["axes"].split(",")) == len(c.params["shape"].split("x"))]
    assert full, "full reductions to a scalar are drawn"
    assert {c.dtype for c in families.generate(0, 160, "cpu")} == {"float32", "float64"}


def test_family_filter():
    cases = families.generate(1, 10, "cpu", ["gemv", "pool"])
    assert {c.family for c in cases} == {"gemv", "pool"}
    with pytest.raises(ValueError, match="unknown families"):
        families.generate(1, 3, "cpu", ["nope"])


# -- (b) the seeded sample -----------------------------------------------------------------------
def test_cpu_sample_is_clean(tmp_path):
    out = tmp_path / "cpu.jsonl"
    results = runner.run_cases(families.generate(0, 24, "cpu"), str(out), timeout=120)
    assert [Result.from_json(line).case.index for line in out.read_text().splitlines()] == \
        list(range(24))
    assert not _failures(results), "\n".join(_failures(results))


def test_low_precision_sample_is_clean():
    """``--lowp``: bf16 / int8 / uint8 matmuls on the micro-kernel route the host's model picks
    (every x86 CPU from AVX2 on has one; int8 results exact)."""
    cases = families.generate(3, 12, "cpu", ["matmul", "batch_matmul"], lowp=True)
    assert {c.dtype for c in cases} == set(families.LOW_PRECISION)
    results = runner.run_cases(cases, None, timeout=120)
    assert not _failures(results), "\n".join(_failures(results))


@needs_nvcc
def test_cuda_sample_is_clean():
    results = runner.run_cases(families.generate(0, 12, "cuda"), timeout=180)
    assert not _failures(results), "\n".join(_failures(results))


# -- (c) the harness catches a broken kernel -----------------------------------------------------
def _tiny(index: int, inject: str = "", target: str = "cpu") -> Case:
    return Case(0, index, "elementwise", "float32", target,
                {"shape": "7x5", "bshape": "1x5", "op": "add"}, inject)


def test_planted_faults_are_caught_and_the_run_goes_on(tmp_path):
    plan = [("", OK), ("wrong", WRONG), ("segfault", CRASH), ("", OK), ("hang", HANG),
            ("", OK), ("error", ERROR), ("", OK)]
    cases = [_tiny(i, inject) for i, (inject, _) in enumerate(plan)]
    out = tmp_path / "faults.jsonl"
    results = runner.run_cases(cases, str(out), timeout=8, jobs=2)
    assert [r.outcome for r in results] == [want for _, want in plan], \
        [(r.outcome, r.message) for r in results]
    by = {r.case.inject: r for r in results if r.case.inject}
    assert "SIGSEGV" in by["segfault"].message and by["segfault"].stage == "build"
    assert "8 s" in by["hang"].message and by["hang"].stage == "build"
    assert by["error"].message.startswith("InjectedError")
    assert by["wrong"].max_err > by["wrong"].tol
    written = [Result.from_json(line) for line in out.read_text().splitlines()]
    assert [r.case.index for r in written] == list(range(len(plan)))
    assert report.exit_status(results) == 1
    assert report.exit_status([r for r in results if r.outcome == OK]) == 0


@needs_nvcc
def test_planted_wrong_answer_in_a_cuda_replica_is_caught():
    results = runner.run_cases([_tiny(0, "", "cuda"), _tiny(1, "wrong", "cuda")], timeout=180)
    assert [r.outcome for r in results] == [OK, WRONG], [r.message for r in results]
    assert results[1].facts["correctness"] == "wrong"
    assert results[0].facts["correctness"] == "checked" and results[0].facts["launches"]


def test_launch_limits_name_the_facts():
    tgt = tvm.target.Target(check_cuda.TARGET)
    dev = gpu.from_target(tgt)
    kern = KernelResources("k", registers=80, smem_static=50000)
    launch = KernelLaunch("k", (70000, 70000, 1), (33, 33, 1), 200000, [])
    rep = CheckReport("sm_90", "", [], PtxasReport("sm_90", "", {"k": kern}), False,
                      KernelBundle("", "sm_90", [], [], [launch]))
    text = "\n".join(check_cuda.launch_limits(rep, dev))
    for fact in ("1089 threads per block", "not a multiple of the warp",
                 "50000 B static shared memory", "200000 B dynamic", "grid (70000, 70000, 1)",
                 "registers"):
        assert fact in text, text
    fine = KernelLaunch("k", (8, 1, 1), (128, 1, 1), 0, [])
    ok_rep = CheckReport("sm_90", "", [], PtxasReport("sm_90", "", {"k": KernelResources("k", 32)}),
                         False, KernelBundle("", "sm_90", [], [], [fine]))
    assert check_cuda.launch_limits(ok_rep, dev) == []


def test_report_groups_declines_and_counts_tensor_cores():
    def res(i, outcome, msg="", dtype="float32", **facts):
        return Result(Case(0, i, "matmul", dtype, "cuda", {"M": 32, "N": 32, "K": 32}),
                      outcome, msg, facts=facts)

    results = [res(0, OK), res(1, "decline", "no tile fits 49152 B"),
               res(2, "decline", "no tile fits 65536 B"), res(3, WRONG, "off"),
               res(4, OK, dtype="float16", tensor_core=True, all_ge16=True, spill_bytes=8),
               res(5, OK, dtype="float16", tensor_core=False, all_ge16=True,
                   correctness=check_cuda.NOT_CHECKED_TC)]
    s = report.summarize(results)
    assert s.by_outcome == {OK: 3, "decline": 2, WRONG: 1}
    assert s.declines == (("no tile fits # B", 2, ("matmul",)),)
    assert s.tensor_core == (1, 2) and s.spilled == 1
    assert s.not_checked == {check_cuda.NOT_CHECKED_TC: 1}
    assert abs(s.decline_rate - 2 / 6) < 1e-12 and s.failed
    md = report.markdown(s, "t")
    assert "| matmul | 6 |" in md and "nvcc_fail" in md and "tensor cores" in md
    assert "wrong" in report.text(s) and "off" in report.text(s)


def test_command_line(tmp_path):
    out = tmp_path / "r.jsonl"
    res = subprocess.run(
        [sys.executable, str(REPO_ROOT / "python" / "random_cases.py"), "--target", "cpu",
         "--seed", "5", "--families", "elementwise,copy_transpose", "--only", "1,3",
         "--out", str(out), "--markdown"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "| **total** | **2** |" in res.stdout
    assert [Result.from_json(x).case.index for x in out.read_text().splitlines()] == [1, 3]


# -- (d) a larger sample -------------------------------------------------------------------------
@pytest.mark.slow
def test_cpu_large_sample_is_clean():
    results = runner.run_cases(families.generate(1, 200, "cpu"), timeout=180, jobs=2)
    assert not _failures(results), "\n".join(_failures(results))


@pytest.mark.slow
@needs_nvcc
def test_cuda_large_sample_is_clean():
    results = runner.run_cases(families.generate(1, 100, "cuda"), timeout=300, jobs=2)
    assert not _failures(results), "\n".join(_failures(results))
