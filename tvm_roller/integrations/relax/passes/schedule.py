"""The pass in which roller schedules every fused PrimFunc of a model (through the planner's
``schedule_function``: a declined or failing function keeps TVM's default, reported)."""
from __future__ import annotations

import time
from typing import List, Optional

import tvm
from tvm import tirx

from tvm_roller.hardware import DeviceModel
from tvm_roller.integrations.relax.passes.shape_bounds import module_bounds
from tvm_roller.planner import (UNSET, Context, FuncReport, ScheduleOptions, context_for,
                                is_scheduled, schedule_function, summarise)

# Show a progress bar when a module has at least this many PrimFuncs to schedule.
PROGRESS_MIN_FUNCS = 16

#: what a Relax compile given a target (not a Context) defaults to: the persistent cache
RELAX_DEFAULTS = {"cache": True}


def relax_context(target, device: Optional[DeviceModel] = None, **given) -> Context:
    """The Context of a Relax entry point given a target or a Context (``planner.context_for``
    with the Relax defaults)."""
    return context_for(target, device, RELAX_DEFAULTS, **given)


def schedule_pass(target, report: Optional[list] = None, device: Optional[DeviceModel] = None,
                  cache=UNSET, progress=UNSET, buckets=UNSET, verify=UNSET,
                  measure_topk=UNSET, check: bool = True) -> tvm.transform.Pass:
    """A module pass that schedules every unscheduled PrimFunc with roller.

    ``target``: a target or the planner's :class:`Context`, whose options (cache, progress,
    buckets, verify, measure) it reads; an option given here changes the Context's. For a
    target: ``cache`` True (the default persistent cache), False / None (none) or a
    ScheduleCache. ``progress``: a tqdm bar over functions; None = only for modules with many
    functions. A function with symbolic extents is planned per bucket of its shape variables,
    within the bounds the module's Relax functions give them; ``buckets`` (variable name ->
    bucket upper ends) replaces the default powers of two. ``verify``: each kernel run once
    against TVM's default build of its function on random inputs; one that differs is an
    error entry and the function falls back (``planner.verify``). ``measure_topk`` (> 1): each
    function's best ``measure_topk`` candidates built and timed on this machine, the fastest
    kept and cached (``planner.measure``). ``check``: each kernel built alone as it is
    scheduled, so one TVM cannot compile falls back alone (``compile`` first builds without, and
    checks only if the whole build fails: the kernels' own builds are ~40% of a compile).
    ``report`` gets one dict per PrimFunc (:class:`~tvm_roller.planner.FuncReport`)."""
    ctx = relax_context(target, device, cache=cache, progress=progress, buckets=buckets,
                        verify=verify, measure_topk=measure_topk)

    @tvm.transform.module_pass(opt_level=0, name="RollerSchedule")
    def _schedule(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        todo = [(gv, f) for gv, f in mod.functions_items()
                if isinstance(f, tirx.PrimFunc) and not is_scheduled(f)]
        options = ScheduleOptions(module_bounds(mod), ctx.buckets, verify=ctx.verify)
        entries: List[FuncReport] = []
        for gv, func in _progress(todo, ctx.progress):
            t0 = time.perf_counter()
            res = schedule_function(func, ctx, gv.name_hint, options, check or ctx.verify)
            if res.kernel is not None:
                mod[gv] = res.kernel
            res.entry.schedule_s = time.perf_counter() - t0
            entries.append(res.entry)
        summarise(entries)
        if report is not None:
            report.extend(e.to_dict() for e in entries)
        return mod

    return _schedule


def _progress(items, progress: Optional[bool]):
    show = len(items) >= PROGRESS_MIN_FUNCS if progress is None else progress
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="roller", unit="func", leave=False)
