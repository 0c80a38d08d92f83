"""What importing the package does: the public names load lazily (``tvm_roller.llm`` among
them), and the environment is left alone (TVM's thread pool is sized by the first call into
roller, ``hardware.threads.size_thread_pool``)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

_THREAD_VARS = ("TVM_NUM_THREADS", "OMP_NUM_THREADS")


def _run_clean(code: str) -> None:
    """``code`` in a fresh interpreter whose environment sets no thread count."""
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARS}
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def test_llm_is_a_lazy_public_name():
    _run_clean(
        "import sys, tvm_roller\n"
        "assert 'llm' in tvm_roller.__all__\n"
        "eager = [m for m in ('tvm_roller.llm', 'tvm_roller.integrations.llm')\n"
        "         if m in sys.modules]\n"
        "assert not eager, eager\n"
        "llm = tvm_roller.llm\n"
        "assert llm is sys.modules['tvm_roller.llm']\n"
        "assert llm.compile is sys.modules['tvm_roller.integrations.llm'].compile\n")


def test_import_sets_no_thread_count_and_the_first_call_does():
    _run_clean(
        "import os, tvm_roller\n"
        "assert 'TVM_NUM_THREADS' not in os.environ, os.environ['TVM_NUM_THREADS']\n"
        "from tvm_roller.hardware.threads import size_thread_pool, usable_cores\n"
        "size_thread_pool()\n"
        "n = os.environ['TVM_NUM_THREADS']\n"
        "assert n == str(len(os.sched_getaffinity(0))) == str(usable_cores()), n\n"
        "size_thread_pool()\n"
        "assert os.environ['TVM_NUM_THREADS'] == n\n")


def test_making_a_context_sizes_the_pool():
    _run_clean(
        "import os\n"
        "from tvm_roller.planner import Context\n"
        "assert 'TVM_NUM_THREADS' not in os.environ\n"
        "Context.make({'kind': 'llvm', 'mcpu': 'skylake-avx512', 'num-cores': 2})\n"
        "assert os.environ['TVM_NUM_THREADS'] == str(len(os.sched_getaffinity(0)))\n")


@pytest.mark.parametrize("var,value", [("TVM_NUM_THREADS", "3"), ("OMP_NUM_THREADS", "1")])
def test_size_thread_pool_keeps_the_users_count(monkeypatch, var, value):
    from tvm_roller.hardware.threads import size_thread_pool

    for v in _THREAD_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, value)
    size_thread_pool()
    assert os.environ[var] == value
    assert var == "TVM_NUM_THREADS" or "TVM_NUM_THREADS" not in os.environ
