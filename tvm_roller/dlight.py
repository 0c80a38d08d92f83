"""``tvm_roller.dlight.Roller``: roller as a drop-in dlight ScheduleRule.

    from tvm.s_tir import dlight as dl
    with target:
        mod = dl.ApplyDefaultSchedule(tvm_roller.dlight.Roller(), dl.gpu.Fallback())(mod)

The rule schedules every function roller handles and returns None for the rest (never raises on
them), so the next rule in the list takes them; why each one was declined is kept in
``rule.declined`` and given as a FallbackWarning.
"""
from __future__ import annotations

import warnings
from typing import Dict, Optional

from tvm import s_tir, tirx
from tvm.target import Target

from tvm_roller.api import apply, plan
from tvm_roller.core.errors import FallbackWarning, UnsupportedError
from tvm_roller.hardware import DeviceModel


class Roller(s_tir.dlight.ScheduleRule):
    """Schedule a PrimFunc from roller's top rTile; decline (None) what roller cannot handle."""

    def __init__(self, device: Optional[DeviceModel] = None) -> None:
        self.device = device
        self.declined: Dict[str, str] = {}  # function name -> reason

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> Optional[s_tir.Schedule]:
        name = _func_name(func)
        if not isinstance(func, tirx.PrimFunc):
            return None
        try:
            p = plan(func, target, 1, self.device)
            return apply(p, p.tiles[0])
        except UnsupportedError as err:
            # reported, not silent: the next rule (or TVM's default) builds this function
            self.declined[name] = str(err)
            warnings.warn(f"tvm_roller.dlight.Roller declined {name}, left to the next rule: {err}",
                          FallbackWarning, stacklevel=2)
            return None


def _func_name(func) -> str:
    attrs = getattr(func, "attrs", None)
    sym = attrs.get("global_symbol") if attrs is not None else None
    if sym is not None:
        return str(sym)
    # ApplyDefaultSchedule passes Relax's private PrimFuncs without a name: tell them apart
    import tvm_ffi

    return f"<anonymous {tvm_ffi.structural_hash(func) & 0xFFFFFFFF:08x}>"
