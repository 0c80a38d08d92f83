"""The context of one call into roller: the target normalised once, its device model and
backend, the notes of what was completed, and the schedule cache to consult.

Made at the edge (``Context.make``: the public functions, a Relax compile, a dlight rule, a
command) and passed down; nothing below it normalises the target again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import tvm

from tvm_roller.backends.base import Backend
from tvm_roller.backends.registry import backend_for
from tvm_roller.cache.schedules import ScheduleCache
from tvm_roller.core.types import TargetLike
from tvm_roller.hardware import DeviceModel, complete_target


@dataclass(frozen=True)
class Measure:
    """Top-k measured: each function's ``topk`` best predicted candidates built and timed on
    this machine within ``budget_s`` seconds, the fastest kept (``planner.measure``)."""

    topk: int = 4
    budget_s: float = 5.0


@dataclass(frozen=True)
class Context:
    """What every plan of one call is made for. Immutable; ``cache`` is the tile source the
    planner consults (None: plan every function afresh, store nothing)."""

    target: tvm.target.Target
    device: DeviceModel
    backend: Backend
    notes: Tuple[str, ...] = ()
    cache: Optional[ScheduleCache] = None
    measure: Optional[Measure] = None  # None: the micro-model's best, unmeasured

    @staticmethod
    def make(target: Union[TargetLike, "Context"], device: Optional[DeviceModel] = None,
             cache: Optional[ScheduleCache] = None,
             measure: Optional[Measure] = None) -> "Context":
        """The context of ``target`` (normalised here, the one time; a Context is taken as it
        is, with ``cache`` set when given), planned for ``device`` (default: the target's own
        model: a preset, the host's /sys or its calibration). UnsupportedError for a target
        roller has no backend for or a device its code cannot run on."""
        if isinstance(target, Context):
            if device is not None and device is not target.device:
                raise ValueError("a Context already holds its device model: pass device= when "
                                 "making it")
            if cache is not None:
                target = dataclasses.replace(target, cache=cache)
            return target if measure is None else dataclasses.replace(target, measure=measure)
        tgt, notes = complete_target(target)
        return Context.for_target(tgt, notes, device, cache, measure)

    @staticmethod
    def for_target(tgt: tvm.target.Target, notes: Sequence[str] = (),
                   device: Optional[DeviceModel] = None,
                   cache: Optional[ScheduleCache] = None,
                   measure: Optional[Measure] = None) -> "Context":
        """The context of a target ``hardware.complete_target`` made (``notes``: what it
        completed): its backend and device model (UnsupportedError as in :meth:`make`)."""
        backend = backend_for(tgt)
        dev = device if device is not None else backend.device_model(tgt)
        notes = tuple(notes) + tuple(backend.check_device(tgt, dev))
        return Context(tgt, dev, backend, notes, cache, measure)

    def pass_context(self) -> tvm.transform.PassContext:
        """The PassContext roller's kernels for this target are compiled under."""
        return tvm.transform.PassContext(opt_level=3, config=dict(self.backend.pass_config))


class InContext:
    """What is planned in a :class:`Context` (a plan, a bucketed plan): its target, device model
    and backend, read from ``ctx``."""

    ctx: Context

    @property
    def target(self) -> tvm.target.Target:
        return self.ctx.target

    @property
    def device(self) -> DeviceModel:
        return self.ctx.device

    @property
    def backend(self) -> Backend:
        return self.ctx.backend
