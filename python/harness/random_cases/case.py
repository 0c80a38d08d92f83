"""The harness's plain data: a random case, and what checking it gave.

Both are frozen and round-trip through one JSON line each, so the parent process and its
isolated workers exchange them over pipes and a run is a ``.jsonl`` file anyone can re-read.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Union

Param = Union[int, str]

# what one check can end in; the first three are no failures. NOT_RUN: built (and compiled to
# machine code) for a ``--llvm-target`` this host cannot run, so neither ok nor wrong
OK, DECLINE, NOT_RUN = "ok", "decline", "not_run"
WRONG, ERROR, CRASH, HANG = "wrong", "error", "crash", "hang"
NVCC_FAIL, OVER_LIMIT = "nvcc_fail", "over_limit"
OUTCOMES = (OK, DECLINE, NOT_RUN, WRONG, ERROR, CRASH, HANG, NVCC_FAIL, OVER_LIMIT)
FAILURES = frozenset({WRONG, ERROR, CRASH, HANG, NVCC_FAIL, OVER_LIMIT})

TARGETS = ("cpu", "cuda")
# test-only faults the worker can plant in a case, to show the harness catches each
INJECTIONS = ("", "wrong", "segfault", "hang", "error")


@dataclass(frozen=True)
class Case:
    """One random case: ``families.make_func`` rebuilds its PrimFunc from these fields alone.

    ``params`` holds ints and strings only (shapes as ``"3x5x7"``, axis lists as ``"0,2"``) so
    that a case read back from JSON compares equal to the generated one. ``llvm_target``: the
    CPU target the case is built for, as canonical JSON (``--llvm-target``; "" = the host)."""

    seed: int
    index: int
    family: str
    dtype: str
    target: str  # "cpu" | "cuda"
    params: Mapping[str, Param] = field(default_factory=dict)
    inject: str = ""  # test-only fault, one of INJECTIONS
    llvm_target: str = ""  # JSON of an llvm target dict; "" builds for the host

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Case":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Case":
        return cls(int(d["seed"]), int(d["index"]), str(d["family"]), str(d["dtype"]),
                   str(d["target"]), dict(d.get("params", {})), str(d.get("inject", "")),
                   str(d.get("llvm_target", "")))

    def label(self) -> str:
        """A one-line name: ``#12 conv2d_nhwc float32 N=1 H=7 ...``."""
        ps = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"#{self.index} {self.family} {self.dtype} {ps}".rstrip()


@dataclass(frozen=True)
class Result:
    """What checking one case gave.

    ``message``: the decline reason, the exception (type and last line), the verify/nvcc
    problems, or the signal. ``max_err`` and ``tol`` are the normalised error of the compared
    output and its bound (None when nothing was compared). ``stage`` names the step that
    decided the outcome. ``facts`` has the measured details (timings, CUDA launch and ptxas
    numbers, tensor-core use, whether correctness could be checked)."""

    case: Case
    outcome: str
    message: str = ""
    stage: str = ""
    max_err: Optional[float] = None
    tol: Optional[float] = None
    seconds: float = 0.0
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES

    def to_json(self) -> str:
        d = asdict(self)
        d["case"] = asdict(self.case)
        return json.dumps(d, sort_keys=True, default=_plain)

    @classmethod
    def from_json(cls, text: str) -> "Result":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Result":
        return cls(Case.from_dict(d["case"]), str(d["outcome"]), str(d.get("message", "")),
                   str(d.get("stage", "")), d.get("max_err"), d.get("tol"),
                   float(d.get("seconds", 0.0)), dict(d.get("facts", {})))


def _plain(value: Any) -> Any:
    """numpy scalars (and anything else) that reach ``facts``: Python numbers, else text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)
