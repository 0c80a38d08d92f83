"""Exceptions as outcomes: which step raised what decides between a decline and an error.

roller's ``UnsupportedError`` from its own steps (plan, apply, build) is a *decline*, a
documented refusal whose message is the reason. nvcc's ``CudaCompileError`` (an
UnsupportedError too) is *nvcc_fail* wherever it comes from. Anything else, and an
UnsupportedError from the harness's own steps (the compute, the reference, the replica), is an
*error*: type and the message's last line, where TVM puts the failed check.
"""
from __future__ import annotations

from typing import Tuple

from tvm_roller.core.errors import UnsupportedError
from harness.cuda_check import CudaCompileError
from harness.random_cases.case import DECLINE, ERROR, NVCC_FAIL

# the steps where a refusal is roller's decision
ROLLER_STAGES = frozenset({"plan", "apply", "build"})
MAX_MESSAGE = 500


def key_line(err: BaseException) -> str:
    """The line of ``err``'s message that says what failed: a TVMScript diagnostic's
    ``error:`` line, else the last line with any text (TVM ends with the failed check; a
    diagnostic ends with a row of carets)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    for ln in lines:
        if ln.lower().startswith("error:"):
            return ln
    text = [ln for ln in lines if any(ch.isalnum() for ch in ln)]
    return text[-1] if text else ""


def describe(err: BaseException) -> str:
    """``Type: key line of the message``."""
    return f"{type(err).__name__}: {key_line(err)}"[:MAX_MESSAGE]


def classify(err: Exception, stage: str) -> Tuple[str, str]:
    """(outcome, message) of ``err`` raised at ``stage``."""
    if isinstance(err, CudaCompileError):
        return NVCC_FAIL, str(err)[:MAX_MESSAGE]
    if isinstance(err, UnsupportedError) and stage in ROLLER_STAGES:
        return DECLINE, " ".join(str(err).split())[:MAX_MESSAGE]
    return ERROR, describe(err)
