"""The three example PyTorch models through ``tvm-roller compile-model``'s path: every one matches
PyTorch (max abs error <= 1e-3); roller schedules every PrimFunc (a gather too, since issue 12)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tvm_roller.tools.compile_model import compile_model, load_factory
from harness.examples import models

from conftest import REPO_ROOT, TARGET  # noqa: E402
# the command line in a fresh process: the example models' package (python/harness) importable
_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    p for p in (str(REPO_ROOT / "python"), os.environ.get("PYTHONPATH")) if p))


@pytest.mark.parametrize("name", ["mlp", "bert_layer", "resnet_cnn"])
def test_example_model_matches_pytorch(name):
    # the pinned target (its preset model): what roller schedules is the same on every host
    r = compile_model(getattr(models, name)(), models.INPUT_SHAPES[name], TARGET, name=name,
                      cache=False, tvm_default=False, min_time_s=0.05)
    assert r.max_abs_err <= 1e-3, r.max_abs_err
    fallbacks = [e for e in r.report if e["status"] == "fallback"]
    assert not fallbacks, fallbacks
    assert sum(e["status"] == "roller" for e in r.report) >= 3


def test_cli_compile_model(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "tvm_roller.tools.cli", "compile-model",
                           "harness.examples.models:mlp", "--input-shape", "3,784",
                           "--no-tvm-default", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=_ENV)
    assert proc.returncode == 0, proc.stderr
    assert "max abs error vs PyTorch" in proc.stdout and "fused_matmul" in proc.stdout
    data = json.loads(out.read_text())
    assert data["input_shape"] == [3, 784] and data["max_abs_err"] <= 1e-3


@pytest.mark.parametrize("spec", ["nocolon", "harness.examples.models:nope", "no_such_mod:f"])
def test_bad_factory_spec(spec):
    with pytest.raises(ValueError):
        load_factory(spec)


def test_cli_bad_input_shape():
    proc = subprocess.run([sys.executable, "-m", "tvm_roller.tools.cli", "compile-model",
                           "harness.examples.models:mlp", "--input-shape", "3,x"],
                          capture_output=True, text=True, timeout=600, env=_ENV)
    assert proc.returncode == 2 and "--input-shape" in proc.stderr
