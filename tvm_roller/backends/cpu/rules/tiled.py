"""Compute-bound GEMM-like functions (matmuls, batch matmuls, ...): register / L1 / L2 tiles."""
from __future__ import annotations

from typing import List

from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.backends.cpu import policy
from tvm_roller.backends.cpu.rules.tiled_base import TiledLoweringRule
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import DeviceModel


class TiledRule(TiledLoweringRule):
    def matches(self, fa: FuncAnalysis) -> bool:
        return fa.kind == "tiled"

    def construct(self, fa: FuncAnalysis, dev: DeviceModel, topk: int) -> List[RTile]:
        return policy.construct_tiled(fa, dev, topk)
