"""GEMM -> GEMM chains on a GPU: one fused kernel when shared memory holds a row block."""
from __future__ import annotations

from typing import List, Optional, Sequence

from tvm import s_tir, tirx

from tvm_roller.backends.base import ChainRule
from tvm_roller.backends.cuda.chain import CudaChainPlan, apply_fused_cuda, plan_cuda_chain
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.fusion.chain import GemmChain
from tvm_roller.fusion.decision import ChainDecision
from tvm_roller.hardware.model import DeviceModel

# what the fused kernel takes between the matmuls: elementwise ops on the rows and one softmax
# (a reshape or a mask built from the scores changes the rows it holds); a PrimFunc called in
# between (FastMathTransform's fast_softmax) is checked when the kernel is built
STAGES = frozenset({"relax.nn.softmax", "relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh",
                    "relax.nn.silu", "relax.add", "relax.subtract", "relax.multiply",
                    "relax.divide", "relax.exp", "relax.tanh", "relax.sigmoid", "identity",
                    "tir:reduction", "tir:elementwise"})


def _lines(p: CudaChainPlan) -> List[str]:
    return [f"  fused kernel: {p.rows} rows per thread block, {p.blocks} blocks of {p.threads} "
            f"threads, register tiles {p.thread_tile} and {p.thread_tile2}, {p.smem_bytes} B "
            f"of shared memory ({p.smem_limit_bytes} B per block)",
            f"  predicted traffic into shared memory: fused {p.traffic_fused / 2**20:.1f} MiB, "
            f"unfused {p.traffic_unfused / 2**20:.1f} MiB"]


class CudaChainRule(ChainRule):
    def plan(self, chain: GemmChain, dev: DeviceModel,
             stage_kinds: Optional[Sequence[str]] = None) -> ChainDecision:
        p = plan_cuda_chain(chain, dev)
        d = ChainDecision(bool(p.fuse), p.reason, p.rows, p, tuple(_lines(p)))
        refused = sorted({k for k in stage_kinds or () if k not in STAGES})
        if refused and d.fuse:
            d = d.refused(f"kept apart: the fused CUDA kernel does not take "
                          f"{', '.join(refused)} between the matmuls")
        return d

    def lower(self, func: tirx.PrimFunc, chain: GemmChain, decision: ChainDecision,
              dev: DeviceModel) -> s_tir.Schedule:
        if not decision.fuse:
            raise UnsupportedError("a GEMM chain not fused on the GPU has no one-function "
                                   "schedule trace: schedule its operators as separate "
                                   "functions")
        return apply_fused_cuda(func, chain, decision.model, dev)
