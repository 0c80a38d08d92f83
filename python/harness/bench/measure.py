"""Measuring helpers the model benchmarks share (python/bench_*.py, sweep_hf_archs.py,
profile_model.py): one model per fresh process, and the time each kernel of a Relax VM takes
(timed by :mod:`tvm_roller.tools.kernel_timing`, which ``tvm-roller profile-model`` uses too)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from tvm_roller.tools.kernel_timing import kernel_calls


@dataclass(frozen=True)
class IsolatedRun:
    """What a child process wrote (its JSON row), or why there is none."""

    row: Optional[dict]
    status: str  # "ok", "exit <code>" or "timeout"
    stderr: str = ""  # only when captured


def run_isolated(script: str, args: Sequence[str], out_flag: str = "--out",
                 fresh_cache: bool = True, capture: bool = False,
                 timeout: Optional[float] = None) -> IsolatedRun:
    """``python script *args <out_flag> FILE`` in a fresh process and read the JSON it writes
    to FILE. ``fresh_cache``: with an empty roller cache (a cold compile is cold); one model's
    thread pools, allocator state and caches must not slow the next (measured: they did, by up
    to 1.6x)."""
    with tempfile.TemporaryDirectory(prefix="roller-run-") as tmp:
        env = dict(os.environ)
        if fresh_cache:
            env["TVM_ROLLER_CACHE"] = os.path.join(tmp, "cache")
        out = os.path.join(tmp, "row.json")
        try:
            proc = subprocess.run([sys.executable, script, *args, out_flag, out], env=env,
                                  capture_output=capture, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return IsolatedRun(None, "timeout")
        stderr = proc.stderr or ""
        if proc.returncode != 0:
            return IsolatedRun(None, f"exit {proc.returncode}", stderr)
        with open(out, encoding="utf-8") as fh:
            return IsolatedRun(json.load(fh), "ok", stderr)


def kernel_times(vm, arg, calls: int) -> Dict[str, float]:
    """Seconds per call of the model of each PrimFunc the VM runs for ``vm["main"](arg)`` (its
    instrument): all of a kernel's invocations in one call of the model together."""
    return {name: t for name, (t, _) in kernel_calls(vm, arg, calls).items()}


def slowest(times: Dict[str, float], top: int) -> List[tuple]:
    """(name, seconds) of the ``top`` slowest, slowest first."""
    return sorted(times.items(), key=lambda kv: -kv[1])[:top]


def write_json(path: str, rows) -> None:
    """``rows`` as indented JSON at ``path`` (its folder created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(rows, fh, indent=1)
