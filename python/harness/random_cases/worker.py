"""The isolated worker: ``python -m harness.random_cases.worker``.

Reads one case (a JSON line) at a time on stdin and answers on stdout with JSON lines: a
``{"step": name}`` note as each step of the check starts (so the parent can say where a case
hung or died) and then the result. It says ``{"ready": true}`` once its imports are done.

The protocol has the original stdout to itself: file descriptor 1 is pointed at stderr, so
whatever TVM, nvcc or a library prints cannot corrupt it. ``faulthandler`` writes the Python
stack to stderr when the process dies of a signal; the parent keeps the tail of stderr.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
from typing import Callable, Optional, TextIO

from harness.random_cases.case import ERROR, Case, Result
from harness.random_cases.outcome import describe
from harness.random_cases.steps import StepHook


def _checker(target: str) -> Callable[..., Result]:
    if target == "cuda":
        from harness.random_cases import check_cuda
        return check_cuda.check
    from harness.random_cases import check_cpu
    return check_cpu.check


def run_one(case: Case, on_step: Optional[StepHook] = None) -> Result:
    """Check ``case`` in this process. The checks classify their own failures; what escapes
    them is a harness bug, reported as an ``error`` at stage ``harness``."""
    try:
        return _checker(case.target)(case, on_step)
    except Exception as err:  # classified: the run goes on with the next case
        return Result(case, ERROR, describe(err), "harness")


def _protocol_stream() -> TextIO:
    """The real stdout for the protocol; fd 1 (and ``sys.stdout``) go to stderr from now on."""
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def serve(inp: TextIO, out: TextIO) -> None:
    def send(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for target in ("cpu", "cuda"):  # import everything before saying ready
        _checker(target)
    send({"ready": True})
    for line in inp:
        if not line.strip():
            continue
        case = Case.from_json(line)
        result = run_one(case, lambda name: send({"step": name}))
        out.write(result.to_json() + "\n")
        out.flush()


def main() -> None:
    faulthandler.enable()
    serve(sys.stdin, _protocol_stream())


if __name__ == "__main__":
    main()
