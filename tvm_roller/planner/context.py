"""The context of one call into roller: the target normalised once, its device model and
backend, the notes of what was completed, the schedule cache to consult, and the caller's
options (what the Relax pipeline, the schedule pass and the planner read).

Made once at the edge (``Context.make``: the public functions, a Relax or LLM compile, a dlight
rule, MetaSchedule, a command) and passed down; nothing below it normalises the target again or
takes an option by hand. ``with_options`` is the one way to change an option of a Context.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import tvm

from tvm_roller.backends.base import Backend
from tvm_roller.backends.registry import backend_for
from tvm_roller.cache.schedules import ScheduleCache
from tvm_roller.core.types import TargetLike
from tvm_roller.hardware import DeviceModel, complete_target
from tvm_roller.hardware.threads import size_thread_pool

#: ``cache=`` as callers give it: True (the default persistent cache), False or None (none), or
#: a ScheduleCache (that one)
CacheArg = Union[bool, None, ScheduleCache]
#: shape variable -> the upper ends of its buckets, as the Context holds them (sorted ints)
Buckets = Mapping[str, Tuple[int, ...]]


@dataclass(frozen=True)
class Measure:
    """Top-k measured: each function's ``topk`` best predicted candidates built and timed on
    this machine within ``budget_s`` seconds, the fastest kept (``planner.measure``)."""

    topk: int = 4
    budget_s: float = 5.0


def schedule_cache(cache: CacheArg) -> Optional[ScheduleCache]:
    """The cache ``cache=`` names (see :data:`CacheArg`)."""
    if cache is False or cache is None:
        return None
    if cache is True:
        return ScheduleCache()
    if not isinstance(cache, ScheduleCache):
        raise TypeError(f"cache must be True, False, None or a ScheduleCache, got "
                        f"{type(cache).__name__}")
    return cache


def _buckets(buckets: Optional[Mapping[str, Sequence[int]]]) -> Optional[Buckets]:
    if not buckets:
        return None
    return {str(k): tuple(sorted(int(e) for e in v)) for k, v in buckets.items()}


def _option_values(options: Dict[str, Any]) -> Dict[str, Any]:
    """The caller's options as the Context holds them (each converted here, the one time)."""
    unknown = set(options) - OPTIONS
    if unknown:
        raise TypeError(f"unknown Context option(s) {sorted(unknown)}; known: {sorted(OPTIONS)}")
    out = dict(options)
    if "cache" in out:
        out["cache"] = schedule_cache(out["cache"])
    if "measure_topk" in out:
        k = int(out.pop("measure_topk"))
        out["measure"] = Measure(k) if k > 1 else None
    if "buckets" in out:
        out["buckets"] = _buckets(out["buckets"])
    if "conv_layouts" in out and out["conv_layouts"] is not None:
        out["conv_layouts"] = dict(out["conv_layouts"])
    return out


@dataclass(frozen=True, eq=False)
class Context:
    """What every plan of one call is made for, and how (immutable). ``cache`` is the tile
    source the planner consults (None: plan every function afresh, store nothing)."""

    target: tvm.target.Target
    device: DeviceModel
    backend: Backend
    notes: Tuple[str, ...] = ()
    cache: Optional[ScheduleCache] = None
    measure: Optional[Measure] = None  # None: the micro-model's best, unmeasured
    # -- what a whole-model compile asks for (``integrations.relax``) --
    fast_math: bool = True          # polynomial exp / tanh / erf (``passes.fast_math``)
    fuse_chains: bool = True        # group matmul chains for Chimera fusion
    conv_layouts: Optional[Dict[str, str]] = None  # None: the backend's; {}: the model's own
    buckets: Optional[Buckets] = None  # None: powers of two (``planner.buckets``)
    verify: bool = False            # each kernel checked against TVM's default build
    progress: Optional[bool] = None  # a progress bar; None: for modules of many functions

    @staticmethod
    def make(target: TargetLike, device: Optional[DeviceModel] = None,
             cache: CacheArg = None, measure: Optional[Measure] = None,
             **options: Any) -> "Context":
        """The context of ``target`` (normalised here, the one time), planned for ``device``
        (default: the target's own model: a preset, the host's /sys or its calibration), with
        ``cache`` (see :data:`CacheArg`; default none), ``measure`` and the options of
        :data:`OPTIONS` (``measure_topk``: a Measure of that many candidates when > 1).
        UnsupportedError for a target roller has no backend for or a device its code cannot
        run on; TypeError for a Context (use :meth:`with_options`) or an unknown option."""
        if isinstance(target, Context):
            raise TypeError("Context.make takes a target; a Context is changed with "
                            "ctx.with_options(...)")
        tgt, notes = complete_target(target)
        ctx = Context.for_target(tgt, notes, device, schedule_cache(cache), measure)
        return ctx.with_options(**options) if options else ctx

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
        size_thread_pool()  # before roller's first kernel runs: TVM fixes its pool then
        return Context(tgt, dev, backend, notes, cache, measure)

    def with_options(self, **options: Any) -> "Context":
        """This context with the given options changed (the names of :data:`OPTIONS`)."""
        return dataclasses.replace(self, **_option_values(options)) if options else self

    def pass_context(self) -> tvm.transform.PassContext:
        """The PassContext roller's kernels for this target are compiled under."""
        return tvm.transform.PassContext(opt_level=3, config=dict(self.backend.pass_config))

    def runtime_device(self, index: int = 0) -> tvm.runtime.Device:
        """The device this context's kernels run on (the target kind's device type)."""
        return tvm.device(self.target.get_target_device_type(), index)

    def compile_options(self) -> Dict[str, Any]:
        """The options that decide what a whole-model compile builds, as plain data (the module
        cache's key)."""
        return {"fast_math": self.fast_math, "fuse_chains": self.fuse_chains,
                "conv_layouts": self.conv_layouts, "verify": self.verify,
                "measure_topk": 0 if self.measure is None else self.measure.topk,
                **({} if not self.buckets else
                   {"buckets": {k: list(v) for k, v in self.buckets.items()}})}


#: the options :meth:`Context.make` and :meth:`Context.with_options` take by name
OPTIONS = frozenset({"cache", "measure", "measure_topk", "fast_math", "fuse_chains",
                     "conv_layouts", "buckets", "verify", "progress"})


class _Unset:
    """An option the caller did not give (its value comes from the Context or the default)."""

    def __repr__(self) -> str:
        return "<unset>"


#: the default of a public keyword that may be given a Context instead of a target
UNSET: Any = _Unset()


def context_for(target: Union[TargetLike, Context], device: Optional[DeviceModel] = None,
                defaults: Optional[Mapping[str, Any]] = None, **given: Any) -> Context:
    """The context of a public function that takes a target or a Context (``get_pipeline``,
    ``schedule_pass``, MetaSchedule's functions): the options given (not :data:`UNSET`) change
    the Context's; a target is made into one, with ``defaults`` for the options not given."""
    options = {k: v for k, v in given.items() if v is not UNSET}
    if isinstance(target, Context):
        if device is not None and device is not target.device:
            raise ValueError("a Context already holds its device model: pass device= when "
                             "making it")
        return target.with_options(**options)
    return Context.make(target, device, **{**(defaults or {}), **options})


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
