"""The random cases for any CPU target (``--llvm-target``): the same cases drawn for every
target, the low-precision matmuls (bf16 x bf16 -> float32, int8 x int8, uint8 x int8 and
uint8 x uint8 -> int32) drawn for every target, a case run and compared where this host can
run the target's code and *not_run* ("built, not run": compiled to an object file) where it
cannot, a declined low-precision case counted as a decline, and the command line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import tvm

from harness.random_cases import check_cpu, families, report, runner, targets
from harness.random_cases.case import DECLINE, FAILURES, NOT_RUN, OK, Case

from conftest import REPO_ROOT

HASWELL = targets.parse('{"kind":"llvm","mcpu":"haswell","num-cores":2}')
AARCH64 = targets.parse('{"kind":"llvm","mtriple":"aarch64-linux-gnu",'
                        '"mattr":["+neon","+dotprod"]}')
LOWP = ["matmul", "batch_matmul"]
PRODUCTS = {("bfloat16", "bfloat16", "float32"), ("int8", "int8", "int32"),
            ("uint8", "int8", "int32"), ("uint8", "uint8", "int32")}


def _failures(results):
    return [f"{r.outcome}: {r.case.label()} [{r.stage}] {r.message}"
            for r in results if r.outcome in FAILURES]


def _product(case: Case):
    return case.dtype, str(case.params.get("b_dtype", case.dtype)), str(case.params["acc"])


# -- the option ----------------------------------------------------------------------------------
def test_llvm_target_is_parsed_to_canonical_json():
    assert HASWELL == '{"kind": "llvm", "mcpu": "haswell", "num-cores": 2}'
    assert targets.parse('{"num-cores":2, "mcpu":"haswell", "kind":"llvm"}') == HASWELL
    assert str(targets.target(AARCH64).kind.name) == "llvm"
    assert targets.arch_of(targets.target(AARCH64)) == "aarch64"
    for bad, why in [("haswell", "not JSON"), ("[1]", "JSON object"),
                     ('{"kind":"cuda"}', '"kind": "llvm"'),
                     ('{"kind":"llvm","mcpu":3}', "no TVM target")]:
        with pytest.raises(ValueError, match=why):
            targets.parse(bad)
    with pytest.raises(ValueError, match="CPU cases"):
        families.generate(0, 3, "cuda", llvm_target=HASWELL)


def test_same_cases_for_every_target():
    """The target does not change what is drawn: case i is the same for the host, Haswell and
    AArch64 (only the field naming the target differs), and it round-trips through JSON."""
    host = families.generate(4, 30, "cpu", lowp=True)
    for tgt in (HASWELL, AARCH64):
        cases = families.generate(4, 30, "cpu", lowp=True, llvm_target=tgt)
        assert [c.llvm_target for c in cases] == [tgt] * 30
        assert [Case.from_dict({**json.loads(c.to_json()), "llvm_target": ""}) for c in cases] \
            == host
        assert all(Case.from_json(c.to_json()) == c for c in cases)


def test_low_precision_products_are_drawn_for_every_target():
    for tgt in ("", HASWELL, AARCH64):
        cases = families.generate(3, 60, "cpu", LOWP, lowp=True, llvm_target=tgt)
        assert {_product(c) for c in cases} == PRODUCTS
    mixed = next(c for c in families.generate(3, 60, "cpu", LOWP, lowp=True)
                 if _product(c) == ("uint8", "int8", "int32"))
    a, b, out = families.build(mixed).tensors
    assert (str(a.dtype), str(b.dtype), str(out.dtype)) == ("uint8", "int8", "int32")
    # the float64 reference's compute is float64 throughout
    assert {str(t.dtype) for t in families.build(mixed, "float64").tensors} == {"float64"}
    # without --lowp nothing changes: float32 / float64 only
    assert {c.dtype for c in families.generate(3, 60, "cpu", LOWP, llvm_target=HASWELL)} == \
        {"float32", "float64"}


# -- can this host run it ------------------------------------------------------------------------
def test_host_runs_its_own_target_and_not_another_architecture():
    from tvm_roller.hardware import host_target

    assert targets.can_run(host_target()).ok
    verdict = targets.can_run(targets.target(AARCH64))
    assert not verdict.ok and "aarch64" in verdict.reason
    # -amx-* in mattr removes AMX from the target's features
    no_amx = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids",
                                "mattr": ["-amx-tile", "-amx-bf16", "-amx-int8"]})
    assert not {f for f in targets.isa_features(no_amx) if f.startswith("amx")}
    assert "avx512bf16" in targets.isa_features(no_amx)


def test_features_decide_and_sse4a_is_read_from_the_assembly(monkeypatch):
    """On a Skylake-AVX512 host: Haswell runs, Sapphire Rapids does not (the host lacks its
    AMX and BF16), Zen 3 does where its code uses no SSE4A instruction. Tuning features
    (``fast-*``, ``false-deps-*``) and system ones (Alder Lake's Key Locker) do not count."""
    skx = targets.isa_features(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}))
    monkeypatch.setattr(targets, "host_features", lambda: skx)
    monkeypatch.setattr(targets, "host_arch", lambda: "x86_64")

    def tgt(mcpu, **kw):
        return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, **kw})

    assert targets.can_run(tgt("haswell")).ok
    spr = targets.can_run(tgt("sapphirerapids"))
    assert not spr.ok and "amx-bf16" in spr.reason and "avx512bf16" in spr.reason
    assert not targets.can_run(tgt("alderlake")).ok  # AVX-VNNI, which Skylake lacks ...
    assert "kl" not in targets.isa_features(tgt("alderlake"))  # ... not Key Locker
    assert not any(f.startswith(("fast-", "false-deps-", "slow-"))
                   for f in targets.isa_features(tgt("znver3")))
    zen3 = tgt("znver3")
    assert targets.needs_asm(zen3) and not targets.can_run(zen3).ok
    assert targets.can_run(zen3, "\tvfmadd231ps %ymm1, %ymm2, %ymm0\n").ok
    used = targets.can_run(zen3, "\textrq $8, $0, %xmm0\n")
    assert not used.ok and "sse4a" in used.reason
    assert not targets.needs_asm(tgt("haswell"))


# -- building and running for a target -----------------------------------------------------------
def test_haswell_cases_build_and_run_where_the_host_can():
    """A handful of cases (low-precision matmuls among them) built for Haswell: run and
    compared here when this host runs Haswell code (every x86-64 host with AVX2 does), else
    built, not run; no failure either way (a decline is roller's documented refusal)."""
    cases = (families.generate(2, 4, "cpu", LOWP, lowp=True, llvm_target=HASWELL)
             + families.generate(2, 4, "cpu", ["conv2d_nhwc", "softmax"],
                                 llvm_target=HASWELL))
    cases = [Case.from_dict({**json.loads(c.to_json()), "index": i})
             for i, c in enumerate(cases)]
    results = runner.run_cases(cases, timeout=180)
    assert not _failures(results), "\n".join(_failures(results))
    runs = targets.can_run(targets.target(HASWELL)).ok
    assert {r.outcome for r in results} <= ({OK, DECLINE} if runs else {NOT_RUN, DECLINE})
    assert any(r.outcome == (OK if runs else NOT_RUN) for r in results)
    for r in results:
        if r.outcome == OK:
            assert r.max_err is not None and r.max_err <= r.tol
            assert r.facts["runs_here"]


def test_aarch64_cases_are_built_not_run(tmp_path):
    """Built for AArch64 on this (x86) host: compiled to an object file, counted as not_run
    with the reason; not_run is no failure, and the report shows its column."""
    if targets.host_arch() == "aarch64":
        pytest.skip("this host is AArch64: it runs the cases")
    cases = (families.generate(5, 3, "cpu", LOWP, lowp=True, llvm_target=AARCH64)
             + families.generate(5, 3, "cpu", ["conv2d_nhwc", "reduce", "elementwise"],
                                 llvm_target=AARCH64))
    cases = [Case.from_dict({**json.loads(c.to_json()), "index": i})
             for i, c in enumerate(cases)]
    results = runner.run_cases(cases, str(tmp_path / "a64.jsonl"), timeout=180)
    assert not _failures(results), "\n".join(_failures(results))
    built = [r for r in results if r.outcome == NOT_RUN]
    assert {r.outcome for r in results} <= {NOT_RUN, DECLINE} and built
    assert all(r.message == "built, not run: aarch64 code; this host is x86_64" and
               r.stage == "codegen" and r.max_err is None for r in built)
    assert all("t_codegen" in r.facts for r in built)
    s = report.summarize(results)
    assert s.by_outcome[NOT_RUN] == len(built) and not s.failed
    assert report.exit_status(results) == 0
    assert "not_run" in s.columns() and "not_run" in report.markdown(s)
    assert f"built, not run: aarch64 code; this host is x86_64: {len(built)} case(s)" in \
        report.text(s)
    assert "not_run" not in report.summarize([r for r in results if r.outcome != NOT_RUN]) \
        .columns()


def test_object_file_of_a_target_is_written():
    """``check_cpu.machine_code``: the AArch64 kernel becomes machine code (its assembly has
    NEON multiply-adds)."""
    import tvm_roller

    case = Case(0, 0, "matmul", "float32", "cpu", {"M": 32, "N": 48, "K": 64, "trans_b": 0},
                llvm_target=AARCH64)
    lib = tvm_roller.build(families.make_func(case), targets.target(AARCH64))
    asm = check_cpu.machine_code(lib, asm=True)
    assert "fmla" in asm


def test_declined_low_precision_case_is_a_decline():
    """A bf16 matmul accumulated in bf16 (no product any CPU route computes) built for Haswell:
    roller's refusal is a decline, counted with its reason."""
    case = Case(0, 7, "matmul", "bfloat16", "cpu",
                {"M": 37, "N": 53, "K": 67, "trans_b": 0, "acc": "bfloat16"},
                llvm_target=HASWELL)
    r = check_cpu.check(case)
    assert r.outcome == DECLINE and r.stage == "build", (r.outcome, r.stage, r.message)
    assert "bfloat16" in r.message
    s = report.summarize([r])
    assert s.by_outcome == {DECLINE: 1} and s.decline_rate == 1.0 and not s.failed
    assert len(s.declines) == 1 and s.declines[0][2] == ("matmul",)


# -- the command line ----------------------------------------------------------------------------
def test_command_line_llvm_target(tmp_path):
    out = tmp_path / "r.jsonl"
    res = subprocess.run(
        [sys.executable, str(REPO_ROOT / "python" / "random_cases.py"), "--seed", "1",
         "--families", "matmul,batch_matmul", "--lowp", "--only", "0,3", "--llvm-target",
         AARCH64, "--out", str(out), "--markdown"],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "built, not run (aarch64 code" in res.stdout
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["case"]["index"] for x in lines] == [0, 3]
    assert all(x["case"]["llvm_target"] == AARCH64 for x in lines)
    bad = subprocess.run(
        [sys.executable, str(REPO_ROOT / "python" / "random_cases.py"), "--target", "cuda",
         "--llvm-target", HASWELL, "-n", "1"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--llvm-target is for --target cpu" in bad.stderr
