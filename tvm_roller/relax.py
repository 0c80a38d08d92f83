"""Relax integration: a ``relax_pipeline`` for ``tvm.compile`` in which roller schedules every PrimFunc.

    ex = tvm.compile(mod, target=target, relax_pipeline=tvm_roller.relax.get_pipeline(target, report))

The pipeline is TVM's default one for the target (library dispatch, legalization, fusion, dataflow
lowering, finalization) with passes added before legalization (rewrites around TVM defects,
inference simplifications, shapes simplified under the shape variables' bounds, convolution
layouts: :mod:`relax_passes.workarounds`, :mod:`relax_passes.inference`,
:mod:`relax_passes.shape_bounds`, :attr:`Backend.conv_layouts`) and one after fusion: roller
plans, schedules and builds each fused PrimFunc alone (one with symbolic extents: a kernel per
bucket of its shape variables, :mod:`tvm_roller.dynamic`). A function roller declines (a gather
inside a reduction, ...) or fails on (a defect: reported as an error) keeps TVM's default
treatment, so one function never fails the model's compile. On a
CUDA target TVM's default treatment is its dlight rules (an unscheduled kernel cannot run on a
GPU), which then see only what roller left.
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

import tvm
from tvm import relax, s_tir, tirx

from tvm_roller.api import (Lowered, Plan, default_schedule, lower, pass_context, plan,
                            resolve_target)
from tvm_roller.backends.registry import backend_for, has_backend
from tvm_roller.analysis import symbolic
from tvm_roller.core.errors import FallbackWarning, UnsupportedError
from tvm_roller.dynamic import lower_dynamic, plan_dynamic
from tvm_roller.fusion import split
from tvm_roller.fusion.chain import GemmChain
from tvm_roller.hardware import DeviceModel
from tvm_roller.module_cache import ModuleCache
from tvm_roller.relax_passes import fast_math as fm
from tvm_roller.relax_passes.chains import chain_shape, group_gemm_chains, reduces_rows
from tvm_roller.relax_passes.inference import inference_pass
from tvm_roller.relax_passes.shape_bounds import bound_shapes_pass, shape_var_bounds
from tvm_roller.relax_passes.workarounds import workarounds_pass
from tvm_roller.schedule_cache import ScheduleCache, cached_schedule

logger = logging.getLogger("tvm_roller")

# Show a progress bar when a module has at least this many PrimFuncs to schedule.
PROGRESS_MIN_FUNCS = 16


@dataclass
class FuncReport:
    """What happened to one PrimFunc: scheduled by roller, or left to TVM's default (and why)."""

    name: str
    status: str                     # "roller" or "fallback"
    kind: str = ""                  # roller's class: tiled / reduction / elementwise / operators
    rtile: Optional[dict] = None    # the applied rTile as plain data
    predicted_s: Optional[float] = None
    reason: str = ""                # why roller declined, or the error it hit
    # "" (scheduled by roller), "decline" (roller does not handle it: the reason says why) or
    # "error" (roller failed on it: a defect, the reason has the exception type and message);
    # a function roller split into operators reports the worst of its parts
    fallback: str = ""
    cached: bool = False            # the plan came from the schedule cache
    schedule_s: float = 0.0         # time spent planning + scheduling this function
    fusion: str = ""                # a matmul chain: "fused" / "unfused", and the model's reason
    # a function with symbolic extents: one dict per bucket kernel (the values it takes, the
    # values it was planned at, its tile; ``tvm_roller.dynamic``)
    buckets: Optional[list] = None

    def to_dict(self) -> dict:
        return asdict(self)


def conv_layout_pass(layouts: Optional[dict] = None) -> tvm.transform.Pass:
    """Convolutions to ``layouts`` (op name -> [data layout, kernel layout]); None: the current
    target's backend's ``conv_layouts`` (none outside a target context or without a backend)."""

    @tvm.transform.module_pass(opt_level=0, name="RollerConvLayout")
    def _convert(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        chosen = layouts
        if chosen is None:
            tgt = tvm.target.Target.current(allow_none=True)
            chosen = backend_for(tgt).conv_layouts if tgt is not None and has_backend(tgt) \
                else {}
        if not chosen or not _calls_any(mod, set(chosen)):
            return mod  # (ConvertLayout itself runs out of memory on some models: DeBERTa)
        try:
            return tvm.transform.Sequential([relax.transform.ConvertLayout(chosen),
                                             relax.transform.FoldConstant()])(mod)
        except RuntimeError as err:  # TVM's pass failed (InternalError): layouts kept
            warnings.warn(f"convolution layout conversion failed ({type(err).__name__}: "
                          f"{_first_lines(err)}); the model's layouts are kept",
                          FallbackWarning, stacklevel=2)
            return mod

    return _convert


def _calls_any(mod: tvm.IRModule, op_names: set) -> bool:
    found = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(
                e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in op_names
                else None)
    return bool(found)


def fusion_passes(fast_math: bool = True, gemm_chains: bool = True,
                  device: Optional[DeviceModel] = None,
                  chains: Optional[list] = None,
                  conv_layouts: Optional[dict] = None) -> tvm.transform.Pass:
    """Legalize and fuse the way roller's pipeline does (elementwise epilogues join their producer).

    MetaSchedule tasks extracted from ``fusion_passes()(mod)`` are exactly the PrimFuncs the roller
    pipeline schedules, so records written for them apply to what the pipeline builds.
    ``fast_math`` swaps exp/tanh for TVM's polynomial versions (``FastMathTransform``) and erf /
    GELU for roller's rational erf (:mod:`relax_passes.fast_math`): these vectorize, while LLVM's
    scalar libm calls otherwise bound softmax and GELU. Errors stay below 1e-6.
    ``conv_layouts``: see :func:`conv_layout_pass` (``{}`` keeps the model's layouts)."""
    fast = [relax.transform.FastMathTransform()] if fast_math else []
    # matmul -> ... -> matmul chains become one PrimFunc each (Chimera; see tvm_roller.fusion)
    group = [relax.transform.FoldConstant(), group_chains_pass(device, chains)] \
        if gemm_chains else []
    return tvm.transform.Sequential([bound_shapes_pass(), workarounds_pass(), inference_pass(),
                                     conv_layout_pass(conv_layouts)] + fast + group + [
        relax.transform.LegalizeOps(fm.legalize_map() if fast_math else None),
        bound_shapes_pass(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ], name="RollerFusion")


def group_chains_pass(device: Optional[DeviceModel] = None,
                      decisions: Optional[list] = None) -> tvm.transform.Pass:
    """Group each matmul -> ... -> matmul chain of every Relax function into one primitive
    function (``relax_passes.chains``) when roller's data-movement model says fusing it pays on
    the current target's device (or ``device``); the other chains' operators are fused and
    scheduled one by one as usual. ``decisions`` gets one dict per chain found: its shape,
    whether it is fused and the model's reason."""
    def decide(first, second, kinds) -> bool:
        shape = chain_shape(first, second)
        tgt = tvm.target.Target.current(allow_none=True)
        if shape is None or tgt is None or not has_backend(tgt):
            return False
        backend = backend_for(tgt)
        if backend.chain_rule is None:
            return False
        batch, m, k, l, n, dtype = shape  # noqa: E741
        if dtype not in ("float32", "float64"):
            return False
        dev = device if device is not None else backend.device_model(tgt)
        chain = GemmChain("", "", [], batch, m, k, l, n, dtype, 4 if dtype == "float32" else 8,
                          row_reduction=reduces_rows(kinds))
        label = f"{m}x{k} . {k}x{l} . {l}x{n}, batch {batch}"
        try:
            plan = backend.chain_rule.plan(chain, dev, stage_kinds=kinds)
        except UnsupportedError as err:  # a decline: the chain's operators stay apart
            return _kept_apart(label, f"declined: {err}", decisions)
        except Exception as err:  # noqa: BLE001  (a defect: reported, the chain kept apart)
            reason = f"error: {type(err).__name__}: {_first_lines(err)}"
            logger.warning("tvm_roller: error planning matmul chain %s, kept apart: %s",
                           label, reason)
            return _kept_apart(label, reason, decisions)
        logger.info("tvm_roller: matmul chain %sx%sx%sx%s (batch %s): %s (%s)", m, k, l, n, batch,
                    "fuse" if plan.fuse else "keep apart", plan.reason)
        if decisions is not None:
            decisions.append({"chain": label, "fused": bool(plan.fuse), "reason": plan.reason})
        return plan.fuse

    @tvm.transform.module_pass(opt_level=0, name="RollerGroupGemmChains")
    def _group(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function) and not (func.attrs is not None and
                                                         func.attrs.get("Primitive")):
                mod, names = group_gemm_chains(mod, gv.name_hint, decide)
                if names:
                    logger.info("tvm_roller: %d matmul chain(s) in %s grouped for fusion",
                                len(names), gv.name_hint)
        return mod

    return _group


def _kept_apart(label: str, reason: str, decisions: Optional[list]) -> bool:
    """A chain the grouping pass leaves as separate operators because its plan failed."""
    if decisions is not None:
        decisions.append({"chain": label, "fused": False, "reason": reason})
    return False


def schedule_pass(target, report: Optional[list] = None, device: Optional[DeviceModel] = None,
                  cache=True, progress: Optional[bool] = None,
                  buckets: Optional[dict] = None) -> tvm.transform.Pass:
    """A module pass that schedules every unscheduled PrimFunc with roller (see module doc).

    ``cache``: True (the default persistent cache), False (none) or a ScheduleCache.
    ``progress``: a tqdm bar over functions; None = only for modules with many functions.
    A function with symbolic extents is planned per bucket of its shape variables
    (:mod:`tvm_roller.dynamic`), within the bounds the module's Relax functions give them;
    ``buckets`` (variable name -> bucket upper ends) replaces the default powers of two."""
    tgt, dev, _ = resolve_target(target, device)
    sched_cache = _resolve_cache(cache)

    @tvm.transform.module_pass(opt_level=0, name="RollerSchedule")
    def _schedule(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        todo = [(gv, f) for gv, f in mod.functions_items()
                if isinstance(f, tirx.PrimFunc) and not is_scheduled(f)]
        dynamic = DynamicOptions(module_bounds(mod), buckets)
        entries: List[FuncReport] = []
        bar = _progress(todo, progress)
        for gv, func in bar:
            t0 = time.perf_counter()
            new, entry = schedule_function(gv.name_hint, func, tgt, dev, sched_cache, dynamic)
            if new is not None:
                mod[gv] = new
            entry.schedule_s = time.perf_counter() - t0
            entries.append(entry)
        _summarise(entries)
        if report is not None:
            report.extend(e.to_dict() for e in entries)
        return mod

    return _schedule


def get_pipeline(target, report: Optional[list] = None, device: Optional[DeviceModel] = None,
                 cache=True, progress: Optional[bool] = None,
                 fast_math: bool = True, chains: Optional[list] = None,
                 fuse_chains: bool = True,
                 conv_layouts: Optional[dict] = None,
                 buckets: Optional[dict] = None) -> tvm.transform.Pass:
    """TVM's default Relax pipeline for ``target`` with roller scheduling every fused PrimFunc.

    Usable as ``tvm.compile(mod, target=target, relax_pipeline=get_pipeline(target))``. When
    ``report`` is a list, one entry (a dict, see :class:`FuncReport`) per PrimFunc is appended.
    ``cache``: the persistent schedule cache (True: the default one; False: none; or a
    :class:`~tvm_roller.schedule_cache.ScheduleCache`). ``fast_math``: see :func:`fusion_passes`.
    ``chains`` (a list) gets one dict per matmul chain found: fused or kept apart, and why;
    ``fuse_chains=False`` turns the matmul-chain fusion off; ``conv_layouts``: the layouts
    convolutions are converted to (None: the backend's ``conv_layouts``; ``{}``: keep the
    model's); ``buckets``: see :func:`schedule_pass`."""
    tgt, _, _ = resolve_target(target, device)
    roller = schedule_pass(tgt, report, device, cache, progress, buckets)

    @tvm.transform.module_pass(opt_level=0, name="RollerPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        backend = backend_for(tgt)
        stages = backend.relax_stages()
        with tgt:
            seq = tvm.transform.Sequential(
                # before DispatchSortScan legalizes the scans (it needs their shapes)
                [bound_shapes_pass(), workarounds_pass()]
                + stages.library_dispatch_passes(tgt)
                + [fusion_passes(fast_math, fuse_chains, device,
                                 chains, conv_layouts), roller]
                + backend.fallback_passes(tgt)
                + stages.dataflow_lower_passes(tgt)
                + stages.finalize_passes(tgt))
            return seq(mod)

    return _pipeline


def compile(mod: tvm.IRModule, target, report: Optional[list] = None,
            device: Optional[DeviceModel] = None, cache=True, fast_math: bool = True,
            progress: Optional[bool] = None, chains: Optional[list] = None,
            fuse_chains: bool = True, conv_layouts: Optional[dict] = None,
            buckets: Optional[dict] = None):
    """``tvm.compile(mod, target, relax_pipeline=get_pipeline(...))`` with a whole-module cache.

    With ``cache`` on, the compiled library is kept (see :mod:`tvm_roller.module_cache`) under a key
    made of the module's structural hash, the target, the device constants and roller's code, so
    compiling the same model again is a load. Returns something ``relax.VirtualMachine`` takes.
    On a cache hit ``report`` gets the entries stored with the library (``cached`` set).
    ``chains`` gets the fusion decision for each matmul chain (not on a cache hit).
    ``buckets``: see :func:`schedule_pass` (a model with a dynamic dimension is compiled once
    for every value of it; each function's report entry lists its bucket kernels)."""
    tgt, dev, _ = resolve_target(target, device)
    options = {"fast_math": fast_math, "fuse_chains": fuse_chains,
               "conv_layouts": conv_layouts}
    if buckets:
        options["buckets"] = {str(k): sorted(int(e) for e in v) for k, v in buckets.items()}
    mcache = None if cache is False or cache is None else ModuleCache()
    if mcache is not None:
        hit = mcache.load(mod, tgt, dev, options)
        if hit is not None:
            lib, entries = hit
            if report is not None:
                report.extend(dict(e, cached=True) for e in entries)
            _summarise([FuncReport(**dict(e, cached=True)) for e in entries])
            return lib
    entries: list = []
    with pass_context(tgt):
        ex = tvm.compile(mod, target=tgt, relax_pipeline=get_pipeline(
            tgt, entries, device, cache, progress, fast_math, chains, fuse_chains,
            conv_layouts, buckets))
    if report is not None:
        report.extend(entries)
    if mcache is not None:
        mcache.store(mod, tgt, dev, options, ex, entries)
    return ex


# -- helpers ------------------------------------------------------------------------------------
def is_scheduled(func: tirx.PrimFunc) -> bool:
    """Marked done by a schedule rule or pass (``tirx.is_scheduled``): left alone."""
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def _resolve_cache(cache):
    if cache is False or cache is None:
        return None
    return ScheduleCache() if cache is True else cache


@dataclass(frozen=True)
class DynamicOptions:
    """How functions with symbolic extents are bucketed: the shape variables' bounds (name ->
    (lower, upper)) and the user's bucket ends (name -> sizes; None: powers of two)."""

    bounds: Optional[dict] = None
    buckets: Optional[dict] = None


def module_bounds(mod: tvm.IRModule) -> dict:
    """Shape variable name -> (lower, upper) from every Relax function of ``mod``."""
    out: dict = {}
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for name, (lo, hi) in shape_var_bounds(func).items():
                old_lo, old_hi = out.get(name, (None, None))
                out[name] = (lo if old_lo is None else min(lo, old_lo) if lo is not None
                             else old_lo,
                             hi if old_hi is None else max(hi, old_hi) if hi is not None
                             else old_hi)
    return out


def schedule_function(name: str, func: tirx.PrimFunc, tgt, dev, sched_cache=None,
                      dynamic: Optional[DynamicOptions] = None
                      ) -> Tuple[Optional[tirx.PrimFunc], FuncReport]:
    """One PrimFunc of a model: (its roller-scheduled version, or None to leave it to TVM's
    default; the report entry). Never raises for a failure inside roller: a function roller
    declines (UnsupportedError) or fails on (any other error: a defect, reported with its type)
    is left to TVM's default, except one holding several operators, which is retried as those
    operators one by one (each roller-scheduled, or left to TVM's default on its own). A
    function with symbolic extents gets one kernel per bucket (``dynamic``)."""
    dynamic = dynamic or DynamicOptions()
    kernel = _symbolic_kernel if symbolic.is_symbolic(func) else _static_kernel
    try:
        return kernel(name, func, tgt, dev, sched_cache, dynamic)
    except UnsupportedError as err:
        return _as_operators(name, func, tgt, dev, sched_cache, "decline", str(err), dynamic)
    except Exception as err:  # noqa: BLE001  (reported as a roller error, never swallowed)
        reason = f"{type(err).__name__}: {_first_lines(err)}"
        logger.warning("tvm_roller: error scheduling %s, left to TVM's default: %s", name, reason)
        return _as_operators(name, func, tgt, dev, sched_cache, "error", reason, dynamic)


def _static_kernel(name, func, tgt, dev, sched_cache, _dynamic):
    p, lowered, cached = _schedule_one(func, tgt, dev, sched_cache)
    new = _checked(lowered.schedule.mod["main"], tgt)
    decision = lowered.fusion
    fusion = ""
    if decision is not None:
        fusion = f"{'fused' if decision.fuse else 'unfused'}: {decision.reason}"
    tile = p.tiles[0]
    return new, FuncReport(name, "roller", tile.kind, tile.to_dict(), tile.predicted_s,
                           cached=cached, fusion=fusion)


def _symbolic_kernel(name, func, tgt, dev, _sched_cache, dynamic: DynamicOptions):
    """Its bucket kernels and their dispatch (``tvm_roller.dynamic``)."""
    dp = plan_dynamic(func, tgt, dev, bounds=dynamic.bounds, buckets=dynamic.buckets)
    new = _checked(lower_dynamic(dp), tgt)
    top = dp.cases[-1].plan.tiles[0]
    return new, FuncReport(name, "roller", dp.kind, top.to_dict(), top.predicted_s,
                           buckets=dp.buckets())


def _as_operators(name, func, tgt, dev, sched_cache, fallback: str, reason: str,
                  dynamic: Optional[DynamicOptions] = None):
    """The fallback for ``func``: its operators one by one when it has several (a chain group
    that cannot be fused or planned whole is un-grouped this way), else TVM's default."""
    whole = FuncReport(name, "fallback", reason=reason, fallback=fallback)
    try:
        groups = split.reduction_groups(func)
    except UnsupportedError:
        return None, whole
    if len(groups) < 2:
        return None, whole
    parts: List[Tuple[str, str]] = []  # (fallback kind, reason) of each part left to TVM
    scheduled = []

    def one(part: tirx.PrimFunc) -> s_tir.Schedule:
        new, entry = schedule_function(f"{name}/part", part, tgt, dev, sched_cache, dynamic)
        if new is None:
            parts.append((entry.fallback, entry.reason))
            return s_tir.Schedule(_default_schedule(part, tgt))
        scheduled.append(part)
        return s_tir.Schedule(new)

    try:
        sch = split.build_groups(func, groups, one)
        new = _checked(sch.mod["main"], tgt)
    except Exception as err:  # noqa: BLE001  (the whole function's reason is reported)
        whole.reason += f"; as its operators: {type(err).__name__}: {_first_lines(err)}"
        return None, whole
    if not scheduled:  # every operator left to TVM's default: so is the whole function
        return None, whole
    worst = "error" if fallback == "error" or any(k == "error" for k, _ in parts) else \
        ("decline" if parts else "")
    detail = f"{reason}; built as its {len(groups)} operators one by one"
    if parts:
        detail += f" ({len(parts)} left to TVM's default: " + \
            "; ".join(r for _, r in parts) + ")"
    return new, FuncReport(name, "roller", "operators", reason=detail, fallback=worst)


def _default_schedule(func: tirx.PrimFunc, tgt) -> tirx.PrimFunc:
    """TVM's default treatment of one PrimFunc (the backend's: dlight's rules on a GPU)."""
    return default_schedule(tvm.IRModule({"main": func}), tgt)["main"]


def _checked(func: tirx.PrimFunc, tgt) -> tirx.PrimFunc:
    """``func`` marked scheduled, once TVM has built it alone: a schedule TVM cannot lower or
    compile fails here, for this function alone, not later in the whole model's build."""
    func = func.with_attr("tirx.is_scheduled", True)
    tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=tgt)
    return func


def _first_lines(err: BaseException, limit: int = 300) -> str:
    """An exception's message without TVM's printed IR (it can be megabytes)."""
    text = str(err).strip()
    for marker in ("Error message:", "Check failed"):
        if marker in text:
            text = text[text.index(marker):]
            break
    text = " ".join(text.split())
    return text[:limit] + ("..." if len(text) > limit else "")


def _schedule_one(func, tgt, dev, sched_cache) -> Tuple[Plan, Lowered, bool]:
    """(plan, its best tile lowered, came_from_cache)."""
    if sched_cache is None:
        p = plan(func, tgt, 1, dev)
        return p, lower(p, p.tiles[0]), False
    cs = cached_schedule(func, tgt, dev, cache=sched_cache)
    return cs.plan, cs.lowered, cs.from_cache


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
    errors = [e for e in entries if e.fallback == "error"]
    logger.info("tvm_roller: %d PrimFuncs: %d scheduled by roller (%d from cache), %d left to "
                "TVM's default, %d roller errors", len(entries), n_roller, n_cached,
                len(fallbacks), len(errors))
    if fallbacks:
        detail = "; ".join(f"{e.name} ({e.fallback}): {e.reason}" for e in fallbacks)
        warnings.warn(f"roller left {len(fallbacks)} of {len(entries)} PrimFuncs to TVM's "
                      f"default: {detail}", FallbackWarning, stacklevel=3)
    split_errors = [e for e in errors if e.status == "roller"]
    if split_errors:
        detail = "; ".join(f"{e.name}: {e.reason}" for e in split_errors)
        warnings.warn(f"roller errors inside {len(split_errors)} PrimFuncs built as their "
                      f"operators: {detail}", FallbackWarning, stacklevel=3)
