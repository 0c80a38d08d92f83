"""Memory-bound functions (reductions and elementwise): rows over the cores, vectorized."""
from __future__ import annotations

from typing import List

from tvm import s_tir, tirx

from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.backends.base import OpRule
from tvm_roller.backends.cpu import lower_streaming, policy
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import DeviceModel


class StreamingRule(OpRule):
    name = "streaming"

    def matches(self, fa: FuncAnalysis) -> bool:
        return fa.kind in ("reduction", "elementwise")

    def tile_kind(self, fa: FuncAnalysis) -> str:
        return fa.kind

    def construct(self, fa: FuncAnalysis, dev: DeviceModel, topk: int) -> List[RTile]:
        return policy.construct_streaming(fa, dev, topk)

    def lower(self, func: tirx.PrimFunc, fa: FuncAnalysis, tile: RTile,
              dev: DeviceModel, traceable: bool = False) -> s_tir.Schedule:
        return lower_streaming.apply_streaming(func, fa, tile, dev, traceable)
