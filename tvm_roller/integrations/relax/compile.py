"""``tvm_roller.relax.compile``: the Relax pipeline with roller, and a whole-module cache."""
from __future__ import annotations

import logging
from typing import Optional

import tvm

from tvm_roller.cache.modules import ModuleCache
from tvm_roller.core.errors import first_lines
from tvm_roller.hardware import DeviceModel
from tvm_roller.backends.cpu.microkernel.x86_amx import has_int8_tiles
from tvm_roller.integrations.relax.passes.quantize_dynamic import quantize_gemms
from tvm_roller.integrations.relax.passes.quantize_weights import quantize_for, weight_entries
from tvm_roller.integrations.relax.passes.schedule import relax_context
from tvm_roller.integrations.relax.pipeline import get_pipeline
from tvm_roller.planner import UNSET, Context, FuncReport, summarise

logger = logging.getLogger(__name__)


def compile(mod: tvm.IRModule, target, report: Optional[list] = None,  # noqa: A001
            device: Optional[DeviceModel] = None, cache=UNSET, fast_math=UNSET,
            progress=UNSET, chains: Optional[list] = None, fuse_chains=UNSET,
            conv_layouts=UNSET, buckets=UNSET, verify=UNSET, measure_topk=UNSET,
            weights: str = "fp32"):
    """``tvm.compile(mod, target, relax_pipeline=get_pipeline(...))`` with a whole-module cache.

    With ``cache`` on, the compiled library is kept (see :mod:`tvm_roller.cache.modules`) under
    a key made of the module's structural hash, the target, the device constants, the options
    and roller's code, so compiling the same model again is a load. ``target``: a target or a
    :class:`~tvm_roller.planner.Context` (its options; one given here changes it); for a
    target the options default as in :func:`~tvm_roller.relax.get_pipeline` (``cache`` True:
    the default persistent caches; False: none, nothing read or written; a ScheduleCache: that
    one, with the module cache beside it). Returns something
    ``relax.VirtualMachine`` takes. On a cache hit ``report`` gets the entries stored with the
    library (``cached`` set). ``chains`` gets the fusion decision for each matmul chain (not on
    a cache hit). ``buckets``: see :func:`~tvm_roller.relax.schedule_pass` (a model with a
    dynamic dimension is compiled once for every value of it; each function's report entry
    lists its bucket kernels). ``verify``: the wrong-result guard (see
    :func:`~tvm_roller.relax.schedule_pass`): each kernel checked once against TVM's default
    build of its function; opt-in, it runs every function twice at compile time.
    ``measure_topk``: top-k measured (opt-in): each function's best k candidates timed on this
    machine, the fastest kept in the schedule cache (a later compile reads it back).
    ``weights``: "fp32", or "int8" / "int4" — the constant weights of linear layers quantized
    in groups of 32 and multiplied in integer dot products (``passes.quantize_weights``; a
    weight the format cannot take stays float32, and ``report`` says why). With "int8" on a
    CPU with AMX-INT8, linear layers of many static rows (GEMMs) are quantized per output
    channel with per-row activation scales instead, for AMX's int8 tile products
    (``passes.quantize_dynamic``)."""
    ctx = relax_context(target, device, cache=cache, fast_math=fast_math, progress=progress,
                        fuse_chains=fuse_chains, conv_layouts=conv_layouts, buckets=buckets,
                        verify=verify, measure_topk=measure_topk)
    if weights == "int8" and has_int8_tiles(ctx.target):
        decisions: list = []
        mod = quantize_gemms(mod, decisions)
        if report is not None:
            report.extend(weight_entries(decisions))
    if weights != "fp32":
        mod = quantize_for(mod, ctx.target, weights, report)
    options = ctx.compile_options()
    mcache = _module_cache(ctx)
    if mcache is not None:
        hit = mcache.load(mod, ctx.target, ctx.device, options)
        if hit is not None:
            lib, entries = hit
            if report is not None:
                report.extend(dict(e, cached=True) for e in entries)
            summarise([FuncReport(**dict(e, cached=True)) for e in entries])
            return lib

    def build(check: bool) -> tuple:
        entries: list = []
        found: Optional[list] = None if chains is None else []
        with ctx.pass_context():
            ex = tvm.compile(mod, target=ctx.target, relax_pipeline=get_pipeline(
                ctx, entries, chains=found, check=check))
        return ex, entries, found

    # Each kernel built alone (so one TVM cannot compile falls back alone) costs ~40% of a
    # compile: build the model once without, and with the checks only if that build fails.
    try:
        ex, entries, found = build(check=False)
    except Exception as err:  # noqa: BLE001  (logged, and the checked build re-raises)
        logger.warning("tvm_roller: the model's build failed (%s: %s); building again with each "
                       "kernel checked alone", type(err).__name__, first_lines(err))
        ex, entries, found = build(check=True)
    if report is not None:
        report.extend(entries)
    if chains is not None:
        chains.extend(found)
    if mcache is not None:
        stored = mcache.store(mod, ctx.target, ctx.device, options, ex, entries)
        return ex if stored is None else stored
    return ex


def _module_cache(ctx: Context) -> Optional[ModuleCache]:
    """The whole-module cache beside the context's schedule cache (none without one)."""
    if ctx.cache is None:
        return None
    return ModuleCache(ctx.cache.directory.parent / "modules")
