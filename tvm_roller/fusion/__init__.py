"""Fusion of chains of compute-intensive operators (Chimera-style data-movement model).

``movement`` is plain Python (no TVM import): describe a chain by its loops, tensors and ops,
then ``plan_chain(chain, device)`` chooses the fused block order and tiles and decides whether
fusing beats running the ops one after the other.
"""
from tvm_roller.fusion.movement import (FUSE_THRESHOLD, Chain, ChainPlan, Loop, Op, TensorUse,
                                        conv_chain, data_movement, format_plan, gemm_chain,
                                        memory_usage, mlp_chain, plan_chain, tile_candidates)

__all__ = [
    "Loop", "TensorUse", "Op", "Chain", "ChainPlan", "plan_chain", "format_plan",
    "data_movement", "memory_usage", "tile_candidates", "gemm_chain", "mlp_chain", "conv_chain",
    "FUSE_THRESHOLD",
]
