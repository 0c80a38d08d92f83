"""Whether a tiled kernel copies its panel operand per task (``RTile.pack``).

The micro-kernel reads a GEMM's B (a convolution's weight) one L1 chunk at a time: ``l1`` rows
along the reduction, each a short stretch along the vector axis. When the operand's row stride
is a multiple of a large power of two, those rows fall in the same few L1 sets (a way holds
4 KiB on these CPUs: 48 KiB 12-way, 32 KiB 8-way) and evict each other on every pass — a
2048 x 8192 weight (32 KiB rows) ran a 1,088-row GEMM at 73 GFLOP/s, 176 once the task copied
its panel to a contiguous layout first (docs/history.md, issue 28). The copy is paid once per
task and amortised over the task's rows, so it is chosen only where many rows reuse it.
Constant operands are packed once while compiling instead (``prepack``); this is for the
others (weights passed as arguments, dynamic shapes).
"""
from __future__ import annotations

import dataclasses
import math

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.backends.cpu.prepack import panel_operands
from tvm_roller.core.rtile import RTile

L1_WAY_BYTES = 4096
# more rows of one L1 chunk per distinct set position than this: they conflict (12 ways, and
# the accumulator tile and the other operand's rows need some)
ROWS_PER_SET_POSITION = 4
# rows of a task that reuse each copied element: the copy reads and writes each element once
# (~1 ns a float on one core from L3/DRAM) against 2 x rows flops of the micro-kernel (~7 ps
# each): under ~500 rows it costs more than 10% (copying where 65-342 rows reuse it made
# Qwen2-0.5B's prefill 0.78-0.86x -> 0.56-0.76x HF's)
MIN_REUSE_ROWS = 512


def with_panel_packing(fa: FuncAnalysis, t: RTile) -> RTile:
    """``t`` with its conflicting panel operands listed in ``pack`` (a note says why)."""
    if t.kind != "tiled" or t.vector_axis is None or t.pack:
        return t
    pack, notes = [], []
    for name in panel_operands(fa, t.vector_axis):
        acc = next(a for a in fa.reads if a.buffer == name)
        used = set(acc.axes_used())
        reuse = math.prod(t.l2[i] for i in fa.spatial if i not in used)
        for r in (i for i in fa.reduction if i in used):
            stride = acc.stride_of_axis(r) * acc.bytes_per_elem
            positions = L1_WAY_BYTES // math.gcd(stride, L1_WAY_BYTES) if stride else 0
            if positions and t.l1[r] / positions > ROWS_PER_SET_POSITION \
                    and reuse >= MIN_REUSE_ROWS:
                pack.append(name)
                notes.append(f"{name} copied per task: its {t.l1[r]} rows per L1 chunk "
                             f"({stride} B apart) share {positions} L1 set position(s); "
                             f"{reuse} rows reuse the copy")
                break
    if not pack:
        return t
    return dataclasses.replace(t, pack=pack, notes=list(t.notes) + notes)
