"""``tvm_roller.dlight.Roller``: roller as a drop-in dlight ScheduleRule.

    from tvm.s_tir import dlight as dl
    with target:
        mod = dl.ApplyDefaultSchedule(tvm_roller.dlight.Roller(), dl.gpu.Fallback())(mod)

The rule schedules every function roller handles (through the planner's ``schedule_function``)
and returns None for the rest (never raises on them), so the next rule in the list takes them;
why each one was declined (or what error roller hit) is kept in ``rule.declined`` and given as a
FallbackWarning.
"""
from __future__ import annotations

import warnings
from typing import Dict, Optional

from tvm import s_tir, tirx
from tvm.target import Target

from tvm_roller.core.errors import FallbackWarning, UnsupportedError
from tvm_roller.hardware import DeviceModel
from tvm_roller.planner import Context, ScheduleOptions, schedule_function


# dlight hands over functions without their Relax module, so shape variables come without
# bounds: a function with symbolic extents is declined (the Relax pipeline buckets them)
_NO_BUCKETS = ScheduleOptions(symbolic=False)


class Roller(s_tir.dlight.ScheduleRule):
    """Schedule a PrimFunc from roller's top rTile; decline (None) what roller cannot handle."""

    def __init__(self, device: Optional[DeviceModel] = None) -> None:
        self.device = device
        self.declined: Dict[str, str] = {}  # function name -> reason
        self._contexts: Dict[str, Context] = {}  # the target's JSON -> its context

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> Optional[s_tir.Schedule]:
        if not isinstance(func, tirx.PrimFunc):
            return None
        name = _func_name(func)
        try:
            ctx = self._context(target)
        except UnsupportedError as err:  # no backend for the target, a device it cannot use
            return self._declined(name, str(err))
        res = schedule_function(func, ctx, name, _NO_BUCKETS, check=False)
        if res.error is None:
            return s_tir.Schedule(res.kernel)
        if res.kernel is None:
            return self._declined(name, res.entry.reason)
        self._declined(name, res.entry.reason, "built as its operators")
        return s_tir.Schedule(res.kernel)

    def _declined(self, name: str, reason: str, what: str = "left to the next rule") -> None:
        # reported, not silent: the next rule (or TVM's default) builds what is left
        self.declined[name] = reason
        warnings.warn(f"tvm_roller.dlight.Roller declined {name}, {what}: {reason}",
                      FallbackWarning, stacklevel=3)

    def _context(self, target: Target) -> Context:
        """One context per target this rule is applied for (the target normalised once)."""
        key = str(target)
        if key not in self._contexts:
            self._contexts[key] = Context.make(target, self.device)
        return self._contexts[key]


def _func_name(func) -> str:
    attrs = getattr(func, "attrs", None)
    sym = attrs.get("global_symbol") if attrs is not None else None
    if sym is not None:
        return str(sym)
    # ApplyDefaultSchedule passes Relax's private PrimFuncs without a name: tell them apart
    import tvm_ffi

    return f"<anonymous {tvm_ffi.structural_hash(func) & 0xFFFFFFFF:08x}>"
