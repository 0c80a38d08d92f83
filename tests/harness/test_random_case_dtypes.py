"""What the random-case families draw: float64 for every family (the low-precision draws of
``--lowp`` aside), log-softmax (TOPI's, along any axis) and an RMS norm, and a float64 case
that is float64 throughout (no float32 value in its compute: TOPI's ``rms_norm`` would have
one). The log-softmax and RMS-norm cases that found the defects of issue 41 run clean."""
from __future__ import annotations

import pytest

from harness.random_cases import check_cpu, families
from harness.random_cases.case import OK, Case


def test_every_family_draws_float64():
    cases = families.generate(0, 40 * len(families.FAMILIES), "cpu")
    for name in families.FAMILIES:
        drawn = {c.dtype for c in cases if c.family == name}
        assert "float64" in drawn, f"{name} never drew float64: {drawn}"


def test_log_softmax_and_rms_norm_are_drawn():
    cases = families.generate(3, 20 * len(families.FAMILIES), "cpu",
                              ["log_softmax", "rms_norm"])
    assert {c.family for c in cases} == {"log_softmax", "rms_norm"}
    ranks_axes = {(len(families.dims(str(c.params["shape"]))), int(c.params["axis"]))
                  for c in cases if c.family == "log_softmax"}
    assert any(axis < rank - 1 for rank, axis in ranks_axes)  # a strided axis too


@pytest.mark.parametrize("family", ["log_softmax", "rms_norm", "softmax", "layernorm"])
def test_float64_case_is_float64_throughout(family):
    case = next(c for c in families.generate(5, 200, "cpu", [family]) if c.dtype == "float64")
    assert "float32" not in families.make_func(case).script()


# the shapes of issue 41: the log-softmax's build failed, the RMS norm's was float32
@pytest.mark.parametrize("family,dtype,params", [
    ("log_softmax", "float32", {"shape": "5x17x334", "axis": 2}),
    ("log_softmax", "float64", {"shape": "93x343", "axis": 1}),
    ("log_softmax", "float32", {"shape": "37x11", "axis": 0}),
    ("rms_norm", "float64", {"shape": "91x848"}),
    ("rms_norm", "float64", {"shape": "31x616"}),
])
def test_issue_cases_are_ok(family, dtype, params):
    r = check_cpu.check(Case(0, 0, family, dtype, "cpu", dict(params)))
    assert r.outcome == OK, (r.outcome, r.stage, r.message)
