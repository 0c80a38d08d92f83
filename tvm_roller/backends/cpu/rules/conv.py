"""Convolutions (a window read by a spatial and a reduction axis): their own register tiles."""
from __future__ import annotations

from typing import List

from tvm_roller.analysis.conv import is_convolution
from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.backends.cpu.policy_conv import construct_conv
from tvm_roller.backends.cpu.rules.tiled_base import TiledLoweringRule
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import DeviceModel


class ConvRule(TiledLoweringRule):
    """Lowered, validated and described as a tiled function; constructed by policy_conv."""

    name = "conv"

    def matches(self, fa: FuncAnalysis) -> bool:
        return fa.kind == "tiled" and is_convolution(fa)

    def construct(self, fa: FuncAnalysis, dev: DeviceModel, topk: int) -> List[RTile]:
        return construct_conv(fa, dev, topk)
