"""What the CPU rules of tiled functions share (``tiled`` and ``conv``): the tile limit of the
padded lowering, the lowering of a tiled rTile and its description. Not a rule of its own (not in
``RULES``): each rule adds ``matches`` and ``construct``, and neither imports the other."""
from __future__ import annotations

from typing import List

from tvm import s_tir, tirx

from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.backends.base import TiledOpRule
from tvm_roller.backends.cpu import lower, policy
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import DeviceModel


class TiledLoweringRule(TiledOpRule):
    """A tiled rule lowered by ``lower.apply_tiled``."""

    def tile_limit(self, extent: int, reg: int) -> int:
        # the lowering pads an axis to a multiple of its register tile (ROLLER's epsilon;
        # ``policy.padded_extents``), and its cache tiles divide that padded extent
        return policy.padded_extents_of(extent, reg)

    def lower(self, func: tirx.PrimFunc, fa: FuncAnalysis, tile: RTile,
              dev: DeviceModel, traceable: bool = False) -> s_tir.Schedule:
        return lower.apply_tiled(func, fa, tile)

    def describe(self, tile: RTile) -> List[str]:
        return [f"    register tile {tile.reg}", f"    L1 tile       {tile.l1}",
                f"    L2/task tile  {tile.l2}"]
