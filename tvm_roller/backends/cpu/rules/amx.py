"""GEMM-like functions over bf16 / int8 operands: AMX tile products (``policy_amx``,
``lower_amx``). A target without the AMX feature the operands need is declined with that
reason (the function keeps TVM's default schedule)."""
from __future__ import annotations

from typing import List

from tvm import s_tir, tirx

from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.backends.base import OpRule, TiledOpRule
from tvm_roller.backends.cpu import amx, lower_amx, policy_amx
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import DeviceModel


class AmxRule(TiledOpRule):
    name = "amx"

    def matches(self, fa: FuncAnalysis) -> bool:
        # a product of two low-precision operands (a bf16 max-pool is a tiled reduction too)
        return fa.kind == "tiled" and len(fa.reads) == 2 and \
            all(r.dtype in amx.OPERAND_DTYPES for r in fa.reads)

    def construct(self, fa: FuncAnalysis, dev: DeviceModel, topk: int) -> List[RTile]:
        roles = policy_amx.gemm_roles(fa)
        units = dev.cpu.matrix_units if dev.cpu else ()
        if roles.kind.feature not in units:
            raise UnsupportedError(
                f"{roles.kind.a_dtype} × {roles.kind.b_dtype} products need {roles.kind.feature} "
                f"(AMX); {dev.name} has {', '.join(units) or 'no matrix or dot-product units'}")
        return policy_amx.construct_amx(fa, dev, roles, topk)

    def validate(self, tile: RTile, fa: FuncAnalysis, dev: DeviceModel) -> None:
        """The common checks, then the instruction's: its register tile, the reduction chunk
        (padded: it may exceed the axis), task tiles of the padded extents."""
        OpRule.validate(self, tile, fa, dev)
        policy_amx.check_tile(tile, fa, policy_amx.gemm_roles(fa))

    def lower(self, func: tirx.PrimFunc, fa: FuncAnalysis, tile: RTile,
              dev: DeviceModel, traceable: bool = False) -> s_tir.Schedule:
        return lower_amx.apply_amx(func, fa, tile, policy_amx.gemm_roles(fa))

    def describe(self, tile: RTile) -> List[str]:
        return [f"    AMX product   {tile.tensor_core}", f"    task tile     {tile.l2}"]
