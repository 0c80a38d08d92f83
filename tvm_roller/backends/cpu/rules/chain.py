"""GEMM -> GEMM chains on a CPU (Chimera): the movement model decides, row blocks per task."""
from __future__ import annotations

from typing import Optional, Sequence

from tvm import s_tir, tirx

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.backends.base import ChainRule, OpRule
from tvm_roller.backends.cpu import chain_lower
from tvm_roller.backends.cpu.chain_plan import describe, plan_gemm_chain, rows_per_task
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.fusion.chain import GemmChain
from tvm_roller.fusion.decision import ChainDecision
from tvm_roller.hardware.model import DeviceModel


class CpuChainRule(ChainRule):
    """``op_rules``: the backend's single-operator rules, which plan the operators one by one
    (the unfused side of the decision) as roller would plan each alone."""

    def __init__(self, op_rules: Sequence[OpRule]) -> None:
        self._op_rules = tuple(op_rules)

    def plan_alone(self, fa: FuncAnalysis, dev: DeviceModel) -> RTile:
        """Roller's best rTile for the analysed function alone on ``dev``, from the backend's
        rules."""
        rule = next((r for r in self._op_rules if r.matches(fa)), None)
        if rule is None:
            raise UnsupportedError(f"no CPU rule plans the chain's operator {fa.main}")
        return rule.construct(fa, dev, 1)[0]

    def plan(self, chain: GemmChain, dev: DeviceModel,
             stage_kinds: Optional[Sequence[str]] = None) -> ChainDecision:
        model, times = plan_gemm_chain(chain, dev, self.plan_alone)
        lines = tuple(describe(model)) + tuple(
            "  " + line for line in (times.lines() if times is not None else ()))
        return ChainDecision(bool(model.fuse), model.reason, rows_per_task(chain, model, dev),
                             model, lines, times)

    def lower(self, func: tirx.PrimFunc, chain: GemmChain, decision: ChainDecision,
              dev: DeviceModel) -> s_tir.Schedule:
        lanes = dev.simd_lanes(chain.dtype)
        if not decision.fuse:
            return chain_lower.apply_unfused(func, chain, decision.rows, lanes)
        tiles = decision.prediction.tiles if decision.prediction is not None else (None, None)
        return chain_lower.apply_fused(func, chain, decision.rows, lanes, tiles)
