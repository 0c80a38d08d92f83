"""GEMM -> GEMM chains on a CPU (Chimera): the movement model decides, row blocks per task."""
from __future__ import annotations

from typing import Optional, Sequence

from tvm import s_tir, tirx

from tvm_roller.backends.base import ChainRule
from tvm_roller.backends.cpu import chain_lower
from tvm_roller.backends.cpu.chain_plan import describe, plan_gemm_chain, rows_per_task
from tvm_roller.fusion.chain import GemmChain
from tvm_roller.fusion.decision import ChainDecision
from tvm_roller.hardware.model import DeviceModel


class CpuChainRule(ChainRule):
    def plan(self, chain: GemmChain, dev: DeviceModel,
             stage_kinds: Optional[Sequence[str]] = None) -> ChainDecision:
        model = plan_gemm_chain(chain, dev)
        return ChainDecision(bool(model.fuse), model.reason, rows_per_task(chain, model, dev),
                             model, tuple(describe(model)))

    def lower(self, func: tirx.PrimFunc, chain: GemmChain, decision: ChainDecision,
              dev: DeviceModel) -> s_tir.Schedule:
        how = chain_lower.apply_fused if decision.fuse else chain_lower.apply_unfused
        return how(func, chain, decision.rows, dev.simd_lanes(chain.dtype))
