"""Relax integration: a ``relax_pipeline`` for ``tvm.compile`` in which roller schedules every PrimFunc.

    ex = tvm.compile(mod, target=target, relax_pipeline=tvm_roller.relax.get_pipeline(target, report))

The pipeline is TVM's default one for the target (library dispatch, legalization, fusion, dataflow
lowering, finalization) with one pass added after fusion: roller plans and schedules each fused
PrimFunc; a function roller declines (a gather, a symbolic shape, ...) keeps TVM's default
treatment and is reported with the reason.
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import tvm
from tvm import relax, tirx

from .errors import FallbackWarning, UnsupportedError
from .hardware import DeviceModel

logger = logging.getLogger("tvm_roller")

# Show a progress bar when a module has at least this many PrimFuncs to schedule.
PROGRESS_MIN_FUNCS = 16


@dataclass
class FuncReport:
    """What happened to one PrimFunc: scheduled by roller, or left to TVM's default (and why)."""

    name: str
    status: str                     # "roller" or "fallback"
    kind: str = ""                  # roller's class: tiled / reduction / elementwise
    rtile: Optional[dict] = None    # the applied rTile as plain data
    predicted_s: Optional[float] = None
    reason: str = ""                # why roller declined (fallback only)
    cached: bool = False            # the plan came from the schedule cache
    schedule_s: float = 0.0         # time spent planning + scheduling this function

    def to_dict(self) -> dict:
        return asdict(self)


def fusion_passes() -> tvm.transform.Pass:
    """Legalize and fuse the way roller's pipeline does (elementwise epilogues join their producer).

    MetaSchedule tasks extracted from ``fusion_passes()(mod)`` are exactly the PrimFuncs the roller
    pipeline schedules, so records written for them apply to what the pipeline builds."""
    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ], name="RollerFusion")


def schedule_pass(target, report: Optional[list] = None, device: Optional[DeviceModel] = None,
                  cache=True, progress: Optional[bool] = None) -> tvm.transform.Pass:
    """A module pass that schedules every unscheduled PrimFunc with roller (see module doc).

    ``cache``: True (the default persistent cache), False (none) or a ScheduleCache.
    ``progress``: a tqdm bar over functions; None = only for modules with many functions."""
    from .api import apply, resolve_target

    tgt, dev, _ = resolve_target(target, device)
    sched_cache = _resolve_cache(cache)

    @tvm.transform.module_pass(opt_level=0, name="RollerSchedule")
    def _schedule(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        todo = [(gv, f) for gv, f in mod.functions_items()
                if isinstance(f, tirx.PrimFunc) and not _is_scheduled(f)]
        entries: List[FuncReport] = []
        bar = _progress(todo, progress)
        for gv, func in bar:
            t0 = time.perf_counter()
            name = gv.name_hint
            try:
                p, cached = _plan(func, tgt, dev, sched_cache)
                tile = p.tiles[0]
                sch = apply(p, tile)
            except UnsupportedError as err:
                entries.append(FuncReport(name, "fallback", reason=str(err),
                                          schedule_s=time.perf_counter() - t0))
                continue
            new = sch.mod["main"].with_attr("tirx.is_scheduled", True)
            mod[gv] = new
            entries.append(FuncReport(name, "roller", p.analysis.kind, tile.to_dict(),
                                      tile.predicted_s, cached=cached,
                                      schedule_s=time.perf_counter() - t0))
        _summarise(entries)
        if report is not None:
            report.extend(e.to_dict() for e in entries)
        return mod

    return _schedule


def get_pipeline(target, report: Optional[list] = None, device: Optional[DeviceModel] = None,
                 cache=True, progress: Optional[bool] = None) -> tvm.transform.Pass:
    """TVM's default Relax pipeline for ``target`` with roller scheduling every fused PrimFunc.

    Usable as ``tvm.compile(mod, target=target, relax_pipeline=get_pipeline(target))``. When
    ``report`` is a list, one entry (a dict, see :class:`FuncReport`) per PrimFunc is appended."""
    from .api import resolve_target

    tgt, _, _ = resolve_target(target, device)
    roller = schedule_pass(tgt, report, device, cache, progress)

    @tvm.transform.module_pass(opt_level=0, name="RollerPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        stages = _default_stages(tgt)
        with tgt:
            seq = tvm.transform.Sequential(
                stages.library_dispatch_passes(tgt)
                + [fusion_passes(), roller]
                + stages.dataflow_lower_passes(tgt)
                + stages.finalize_passes(tgt))
            return seq(mod)

    return _pipeline


# -- helpers ------------------------------------------------------------------------------------
def _default_stages(tgt: tvm.target.Target):
    """The module holding TVM's per-stage Relax pass lists for ``tgt``'s backend.

    (``relax.pipeline.dataflow_lower_passes`` would dispatch, but in 0.27 it looks the function up
    on the backend package, which does not export it; the backend's ``pipeline`` module has it.)"""
    import importlib

    backends = {"llvm": "cpu_generic", "cuda": "cuda"}
    kind = tgt.kind.name
    if kind not in backends:
        raise UnsupportedError(f"no Relax pipeline for target kind {kind!r} "
                               f"(supported: {', '.join(backends)})")
    return importlib.import_module(f"tvm.relax.backend.{backends[kind]}.pipeline")


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def _resolve_cache(cache):
    if cache is False or cache is None:
        return None
    from .schedule_cache import ScheduleCache

    return ScheduleCache() if cache is True else cache


def _plan(func, tgt, dev, sched_cache):
    """(plan, came_from_cache)."""
    from .api import plan

    if sched_cache is None:
        return plan(func, tgt, 1, dev), False
    from .schedule_cache import cached_plan

    before = sched_cache.stats().get("hits", 0)
    p = cached_plan(func, tgt, 1, dev, cache=sched_cache)
    return p, sched_cache.stats().get("hits", 0) > before


def _progress(items, progress: Optional[bool]):
    show = len(items) >= PROGRESS_MIN_FUNCS if progress is None else progress
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="roller", unit="func", leave=False)


def _summarise(entries: List[FuncReport]) -> None:
    n_roller = sum(e.status == "roller" for e in entries)
    n_cached = sum(e.cached for e in entries)
    fallbacks = [e for e in entries if e.status == "fallback"]
    logger.info("tvm_roller: %d PrimFuncs: %d scheduled by roller (%d from cache), %d left to "
                "TVM's default", len(entries), n_roller, n_cached, len(fallbacks))
    if fallbacks:
        detail = "; ".join(f"{e.name}: {e.reason}" for e in fallbacks)
        warnings.warn(f"roller declined {len(fallbacks)} of {len(entries)} PrimFuncs, left to TVM's "
                      f"default: {detail}", FallbackWarning, stacklevel=3)
