"""Reuse-heavy functions on a GPU: shared-memory block tiles, per-thread or per-warp tiles."""
from __future__ import annotations

from typing import List

from tvm import s_tir, tirx

from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.backends.base import TiledOpRule
from tvm_roller.backends.cuda import lower, policy, tensorcore_gemm
from tvm_roller.core.errors import InvalidTile, UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import DeviceModel


class TiledRule(TiledOpRule):
    def matches(self, fa: FuncAnalysis) -> bool:
        return policy.gpu_kind(fa) == "tiled"

    def tile_limit(self, extent: int, reg: int) -> int:
        return policy.tile_limit(extent)

    def construct(self, fa: FuncAnalysis, dev: DeviceModel, topk: int) -> List[RTile]:
        return policy.construct_tiled(fa, dev, topk)

    def validate(self, tile: RTile, fa: FuncAnalysis, dev: DeviceModel) -> None:
        super().validate(tile, fa, dev)
        if tile.backend != "cuda" or tile.threads < 1:
            raise InvalidTile(f"not a CUDA block tile (backend {tile.backend!r}, "
                              f"{tile.threads} threads)")
        if tile.tensor_core:
            try:
                tensorcore_gemm.validate_tile(fa, tile, dev)
            except UnsupportedError as err:
                raise InvalidTile(str(err)) from err

    def lower(self, func: tirx.PrimFunc, fa: FuncAnalysis, tile: RTile,
              dev: DeviceModel, traceable: bool = False) -> s_tir.Schedule:
        return lower.apply_tiled(func, fa, tile, dev)

    def describe(self, tile: RTile) -> List[str]:
        reg = "warp tile (tensor cores)" if tile.tensor_core else "register tile (per thread)"
        return [f"    {reg:26s} {tile.reg}",
                f"    {'shared-memory (block) tile':26s} {tile.l1}",
                f"    {tile.threads} threads per block, {tile.stages}-stage pipeline, "
                f"{tile.smem_bytes} B shared memory"]
