"""GEMM-like functions over bf16 / int8 operands: a micro-kernel route (``microkernel``) picked
with its block and task tile by predicted time (``policy_microkernel``, ``lower_microkernel``):
AMX, AVX512-BF16, VNNI, ``vpmaddwd``, NEON dot products, or bf16 → fp32 FMA / int8 widening on
any SIMD CPU. A function with no route is declined with the reason."""
from __future__ import annotations

from typing import List

from tvm import s_tir, tirx

from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.backends.base import OpRule, TiledOpRule
from tvm_roller.backends.cpu import lower_microkernel, policy_microkernel
from tvm_roller.backends.cpu.microkernel import OPERAND_DTYPES
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import DeviceModel


class MicroKernelRule(TiledOpRule):
    name = "microkernel"

    def matches(self, fa: FuncAnalysis) -> bool:
        # a product of two low-precision operands (a bf16 max-pool is a tiled reduction too)
        return fa.kind == "tiled" and len(fa.reads) == 2 and \
            all(r.dtype in OPERAND_DTYPES for r in fa.reads)

    def construct(self, fa: FuncAnalysis, dev: DeviceModel, topk: int) -> List[RTile]:
        roles = policy_microkernel.gemm_roles(fa)
        return policy_microkernel.construct(fa, dev, roles, topk)

    def validate(self, tile: RTile, fa: FuncAnalysis, dev: DeviceModel) -> None:
        """The common checks, then the route's: its block, the reduction chunk (padded: it may
        exceed the axis), task tiles of the padded extents."""
        OpRule.validate(self, tile, fa, dev)
        policy_microkernel.check_tile(tile, fa, dev, policy_microkernel.gemm_roles(fa))

    def lower(self, func: tirx.PrimFunc, fa: FuncAnalysis, tile: RTile,
              dev: DeviceModel, traceable: bool = False) -> s_tir.Schedule:
        roles = policy_microkernel.gemm_roles(fa)
        cand = policy_microkernel.candidate_of(tile, dev, roles)
        return lower_microkernel.apply_microkernel(func, fa, tile, roles, cand)

    def describe(self, tile: RTile) -> List[str]:
        return [f"    micro-kernel  {tile.tensor_core}", f"    {tile.notes[0]}" if tile.notes
                else "", f"    task tile     {tile.l2}"]
