"""The summary of a run: outcomes per family, decline reasons, CUDA facts, failures.

Decline reasons are grouped with their numbers blanked (``#``), so one refusal met at many
sizes is one line. Cases built for an ``--llvm-target`` this host cannot run are counted as
*not_run* (built, not run: no failure, and not ok either) with the reason; the column shows
only when there are such cases. The tensor-core rate counts float16 matmuls with every extent
at least 16 (what an MMA tile can cover) that were scheduled, nvcc-compiled and whose PTX uses
tensor cores. The attention cases are counted by how roller built them: as the flash-attention
kernel, or left to the matmul chains with the flash-attention pass's reason (no failure). A run
*fails* (nonzero exit status of the command) when any case is wrong, crashed, hung, raised,
failed nvcc or broke a device limit.
"""
from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from harness.random_cases.attention import FLASH
from harness.random_cases.case import (DECLINE, FAILURES, NOT_RUN, NVCC_FAIL, OUTCOMES,
                                       OVER_LIMIT, Result)

CUDA_ONLY = (NVCC_FAIL, OVER_LIMIT)


@dataclass(frozen=True)
class Summary:
    total: int
    targets: Tuple[str, ...]
    by_outcome: Mapping[str, int]
    by_family: Mapping[str, Mapping[str, int]]  # family -> outcome -> count
    declines: Tuple[Tuple[str, int, Tuple[str, ...]], ...]  # (reason, count, families)
    failures: Tuple[Result, ...]
    spilled: int  # CUDA cases whose kernels spill registers (not a failure)
    not_checked: Mapping[str, int]  # CUDA correctness not checked, by reason
    tensor_core: Optional[Tuple[int, int]]  # (used, eligible) fp16 matmuls, extents >= 16
    seconds: Tuple[float, float, float]  # mean, median, max per case
    not_run: Optional[Mapping[str, int]] = None  # built, not run (llvm target): reason -> n
    # attention cases by how roller built them: the flash-attention pass's reason -> n
    attention: Optional[Mapping[str, int]] = None

    @property
    def decline_rate(self) -> float:
        return self.by_outcome.get(DECLINE, 0) / self.total if self.total else 0.0

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def columns(self) -> List[str]:
        """Outcome columns for the table: the CUDA-only ones only when there are CUDA cases,
        not_run only when a case was built and not run."""
        return [o for o in OUTCOMES if (o not in CUDA_ONLY or "cuda" in self.targets)
                and (o != NOT_RUN or self.by_outcome.get(NOT_RUN))]


def _reason_key(message: str) -> str:
    return re.sub(r"\d+", "#", message)


def summarize(results: Sequence[Result]) -> Summary:
    by_family: Dict[str, Counter] = defaultdict(Counter)
    reasons: Dict[str, Counter] = defaultdict(Counter)
    not_checked: Counter = Counter()
    not_run: Counter = Counter()
    attention: Counter = Counter()
    spilled, tc_used, tc_eligible = 0, 0, 0
    for r in results:
        by_family[r.case.family][r.outcome] += 1
        if r.outcome == DECLINE:
            reasons[_reason_key(r.message)][r.case.family] += 1
        if r.outcome == NOT_RUN:
            not_run[r.message] += 1
        if "attention" in r.facts:
            attention[str(r.facts["attention"])] += 1
        correctness = str(r.facts.get("correctness", ""))
        if correctness.startswith("not checked"):
            not_checked[correctness] += 1
        if r.facts.get("spill_bytes"):
            spilled += 1
        if r.case.dtype == "float16" and r.facts.get("all_ge16") and "tensor_core" in r.facts:
            tc_eligible += 1
            tc_used += bool(r.facts["tensor_core"])
    declines = tuple(sorted(((k, sum(v.values()), tuple(sorted(v))) for k, v in reasons.items()),
                            key=lambda x: (-x[1], x[0])))
    secs = [r.seconds for r in results] or [0.0]
    return Summary(
        total=len(results), targets=tuple(sorted({r.case.target for r in results})),
        by_outcome=dict(Counter(r.outcome for r in results)),
        by_family={f: dict(c) for f, c in sorted(by_family.items())},
        declines=declines,
        failures=tuple(sorted((r for r in results if r.outcome in FAILURES),
                              key=lambda r: r.case.index)),
        spilled=spilled, not_checked=dict(not_checked),
        tensor_core=(tc_used, tc_eligible) if tc_eligible else None,
        seconds=(statistics.fmean(secs), statistics.median(secs), max(secs)),
        not_run=dict(not_run), attention=dict(attention))


def _facts_lines(s: Summary) -> List[str]:
    lines = [f"decline rate: {s.decline_rate:.1%} ({s.by_outcome.get(DECLINE, 0)} of {s.total})",
             f"seconds per case: mean {s.seconds[0]:.2f}, median {s.seconds[1]:.2f}, "
             f"max {s.seconds[2]:.2f}"]
    lines += [f"{msg}: {n} case(s)" for msg, n in sorted((s.not_run or {}).items())]
    lines += _attention_lines(s.attention or {})
    if "cuda" in s.targets:
        if s.tensor_core is not None:
            used, n = s.tensor_core
            lines.append(f"tensor cores in float16 matmuls with M, N, K >= 16: {used} of {n} "
                         f"({used / n:.0%})")
        else:
            lines.append("tensor cores: no float16 matmul with M, N, K >= 16 was compiled")
        lines.append(f"kernels spilling registers: {s.spilled} case(s)")
        lines += [f"correctness {k}: {v} case(s)" for k, v in sorted(s.not_checked.items())]
    return lines


def _attention_lines(routes: Mapping[str, int]) -> List[str]:
    """How many attention cases ran as the flash kernel, and why the others did not."""
    if not routes:
        return []
    flash = routes.get(FLASH, 0)
    lines = [f"attention as the flash-attention kernel: {flash} of {sum(routes.values())}"]
    lines += [f"attention left to the matmul chains ({n}): {why}"
              for why, n in sorted(routes.items(), key=lambda x: (-x[1], x[0])) if why != FLASH]
    return lines


def text(s: Summary) -> str:
    """A plain-text summary: the family table, declines, facts and every failure."""
    cols = s.columns()
    width = max([len("family"), *map(len, s.by_family)]) + 2
    head = "family".ljust(width) + "cases".rjust(6) + "".join(c.rjust(11) for c in cols)
    lines = [head, "-" * len(head)]
    for fam, counts in s.by_family.items():
        lines.append(fam.ljust(width) + str(sum(counts.values())).rjust(6) +
                     "".join(str(counts.get(c, 0)).rjust(11) for c in cols))
    lines.append("total".ljust(width) + str(s.total).rjust(6) +
                 "".join(str(s.by_outcome.get(c, 0)).rjust(11) for c in cols))
    lines.append("")
    lines += _facts_lines(s)
    if s.declines:
        lines.append("decline reasons:")
        lines += [f"  {n:4d}  {reason}  [{', '.join(fams)}]" for reason, n, fams in s.declines]
    if s.failures:
        lines.append(f"failures ({len(s.failures)}):")
        lines += [f"  {r.outcome:10s} {r.case.label()}  [{r.stage}] {r.message}"
                  for r in s.failures]
    return "\n".join(lines)


def markdown(s: Summary, title: Optional[str] = None) -> str:
    """The family table and the facts as markdown, for BENCHMARKS.md."""
    cols = s.columns()
    lines = [f"**{title}**", ""] if title else []
    lines += ["| family | cases | " + " | ".join(cols) + " |",
              "|---|---:|" + "---:|" * len(cols)]
    for fam, counts in s.by_family.items():
        lines.append(f"| {fam} | {sum(counts.values())} | " +
                     " | ".join(str(counts.get(c, 0)) for c in cols) + " |")
    lines.append(f"| **total** | **{s.total}** | " +
                 " | ".join(f"**{s.by_outcome.get(c, 0)}**" for c in cols) + " |")
    lines.append("")
    lines += [f"- {ln}" for ln in _facts_lines(s)]
    if s.declines:
        lines += ["", "| declines | reason | families |", "|---:|---|---|"]
        lines += [f"| {n} | {reason.replace('|', '/')} | {', '.join(fams)} |"
                  for reason, n, fams in s.declines]
    return "\n".join(lines)


def exit_status(results: Sequence[Result]) -> int:
    """1 when any case failed (wrong, crash, hang, error, nvcc_fail, over_limit), else 0."""
    return int(any(r.outcome in FAILURES for r in results))
