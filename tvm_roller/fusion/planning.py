"""Planning a chain: the best fused plan, the unfused baseline (each op alone, one after the
other) and the decision whether to fuse (fused time < ``FUSE_THRESHOLD`` x unfused time)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from tvm_roller.fusion.chain_plan import ChainPlan
from tvm_roller.fusion.chain_spec import Chain, Op, TensorUse
from tvm_roller.fusion.chain_volume import complete_tiles, fused_problem
from tvm_roller.fusion.inner_tiling import InnerTiling, plan_inner_tiling
from tvm_roller.fusion.levels import Levels, choose_levels, outer_level_index
from tvm_roller.fusion.plan_format import fmt_bytes, fmt_seconds, saving
from tvm_roller.fusion.problem import Problem, build_problem
from tvm_roller.fusion.timing import Nest, NestTimer, run_nest

FUSE_THRESHOLD = 0.95  # fuse only when fused time < FUSE_THRESHOLD * unfused time


def _dtype(chain: Chain) -> str:
    return max(chain.tensors, key=lambda t: t.elem_bytes).dtype_name if chain.tensors else "float32"


def plan_chain(chain: Chain, dev, *, fill: Optional[float] = None,
               tile_level: Optional[str] = None, include_compute: bool = True) -> ChainPlan:
    """Plan ``chain`` on ``dev`` (a ``tvm_roller.hardware.DeviceModel``, duck-typed): the best
    fused order and tiles, the unfused baseline (each op alone, one after the other), and whether
    to fuse (fused time < 0.95 x unfused time).

    ``fill``: usable fraction of each cache level (default 0.5 on a CPU, 1.0 on a GPU);
    ``tile_level``: name of the level the fused blocks are sized for (default: the largest
    private level); ``include_compute``: add the ideal-peak compute time as a term of every
    nest's time (default off: the time is Chimera's ``max_d DV_d / bw_d``; the compute time is
    reported either way)."""
    t0 = time.perf_counter()
    chain.validate()
    s = _setup(chain, dev, fill, tile_level, include_compute)
    fp = _plan_fused(chain, dev, s)
    fused, least_f, all_loops = fp.best, fp.least, s.all_loops
    inter_info = _intermediate_info(chain, s)
    un = _plan_unfused(chain, dev, s, inter_info)
    fuse = bool(s.multi and fused.time_s < FUSE_THRESHOLD * un.time_s)
    reason = _reason(dev, s, fp, un, inter_info, fuse)

    return ChainPlan(
        chain=chain.to_dict(), device=getattr(dev, "name", str(dev)), tile_level=s.tile_name,
        tile_capacity_bytes=int(s.cap), outer_level=s.names[fp.outer],
        order=list(fused.best.order) + [d for d in all_loops if d not in fused.best.order],
        tiles=complete_tiles(chain, fused.tiles), memory_usage_bytes=int(fused.best.mu),
        tasks=int(fused.best.tasks), inner=fused.inner,
        volume_fused=dict(fused.best.dm), volume_unfused=un.volume, total_fused=fused.volume,
        total_unfused=int(sum(un.volume.values())), level_volume_fused=fused.levels,
        level_volume_unfused=un.levels, terms_fused=fused.terms, terms_unfused=un.terms,
        time_fused_s=fused.time_s, time_unfused_s=float(un.time_s),
        compute_fused_s=fused.compute_s, compute_unfused_s=float(un.compute_s),
        bound_fused=fused.bound, unfused_ops=un.ops,
        least_order=list(least_f.best.order) + [d for d in all_loops
                                                if d not in least_f.best.order],
        least_tiles=complete_tiles(chain, least_f.tiles),
        least_volume_fused=dict(least_f.best.dm), least_volume_unfused=un.least,
        least_total_fused=least_f.volume, least_total_unfused=int(sum(un.least.values())),
        intermediates=inter_info, include_compute=include_compute, fuse=fuse, reason=reason,
        plan_s=time.perf_counter() - t0)


@dataclass(frozen=True)
class _Setup:
    """What every step of :func:`plan_chain` reads: the levels, the extents, the usable
    capacity of the tile level, the chain's tensors and each op's inner-level tiling."""

    lv: Levels
    names: List[str]  # the device's levels, fastest first
    ext: Dict[str, int]
    all_loops: List[str]
    dtype: str
    cap: float  # usable bytes of the tile level per core
    line: int  # the tile level's line bytes
    inter: List[TensorUse]
    inter_names: List[str]
    io_bytes: int  # the chain's inputs and outputs
    multi: bool  # more than one op
    inner: Dict[str, Optional[InnerTiling]]  # by op name
    include_compute: bool

    @property
    def tile_name(self) -> str:
        return self.names[self.lv.tile]


def _setup(chain: Chain, dev, fill: Optional[float], tile_level: Optional[str],
           include_compute: bool) -> _Setup:
    lv = choose_levels(dev, fill, tile_level)
    names = [x.name for x in dev.levels]
    ext = chain.extents()
    all_loops = [lp.name for lp in chain.loops]
    dtype = _dtype(chain)
    cap = lv.usable(dev, lv.tile)
    line = dev.levels[lv.tile].line_bytes
    inter = chain.intermediates()
    inter_names = [t.name for t in inter]
    io_bytes = sum(chain.tensor_bytes(t.name) for t in chain.tensors if t.role != "intermediate")
    multi = len(chain.ops) > 1
    inner = {op.name: plan_inner_tiling(chain, dev, lv, op) for op in chain.ops}
    return _Setup(lv, names, ext, all_loops, dtype, cap, line, inter, inter_names, io_bytes,
                  multi, inner, include_compute)


@dataclass(frozen=True)
class _FusedPlans:
    problem: Problem
    outer: int  # the level the fused tiles stream from
    best: Nest  # least predicted time
    least: Nest  # least volume (Chimera)


def _plan_fused(chain: Chain, dev, s: _Setup) -> _FusedPlans:
    # -- fused -----------------------------------------------------------------------------------
    pf = fused_problem(chain, line_bytes=s.line)
    outer_f = outer_level_index(dev, s.lv.tile, s.io_bytes)
    timer_f = NestTimer(dev, s.lv, outer_f, s.io_bytes, chain.flops(), s.dtype,
                        s.include_compute, list(s.inner.values()), s.ext)
    fused = run_nest(pf, s.cap, timer_f, s.all_loops)
    least_f = run_nest(pf, s.cap, timer_f, s.all_loops, "volume")
    return _FusedPlans(pf, outer_f, fused, least_f)


def _intermediate_info(chain: Chain, s: _Setup) -> List[Dict[str, Any]]:
    inter_info = []
    for t in s.inter:
        size = chain.tensor_bytes(t.name)
        inter_info.append({"name": t.name, "shape": {d: s.ext[d] for d in t.loops},
                           "dtype": t.dtype_name, "bytes": int(size),
                           "fits_tile_level": bool(size <= s.cap)})
    return inter_info


@dataclass
class _Unfused:
    """The unfused baseline: each op's plans, and their volumes, terms and times summed over
    the ops (one after the other)."""

    ops: List[Dict[str, Any]] = field(default_factory=list)
    volume: Dict[str, int] = field(default_factory=dict)
    least: Dict[str, int] = field(default_factory=dict)
    levels: Dict[str, int] = field(default_factory=dict)
    terms: Dict[str, float] = field(default_factory=dict)
    time_s: float = 0.0
    compute_s: float = 0.0


def _plan_unfused(chain: Chain, dev, s: _Setup,
                  inter_info: Sequence[Dict[str, Any]]) -> _Unfused:
    # -- unfused: each op alone ------------------------------------------------------------------
    free_u = [i["name"] for i in inter_info if i["fits_tile_level"]]
    un = _Unfused()
    for op in chain.ops:
        _plan_unfused_op(chain, dev, s, op, free_u, un)
    return un


def _plan_unfused_op(chain: Chain, dev, s: _Setup, op: Op, free_u: Sequence[str],
                     un: _Unfused) -> None:
    """Plan ``op`` alone and add its plans to ``un``."""
    pu = build_problem(chain, [op], s.ext, free_u, s.line)
    foot = sum(chain.tensor_bytes(tn) for tn in op.tensors)
    outer_u = outer_level_index(dev, s.lv.tile, foot)
    comp = sum(chain.tensor_bytes(tn) for tn in op.tensors if tn not in s.inter_names)
    timer_u = NestTimer(dev, s.lv, outer_u, comp, chain.op_flops(op), s.dtype,
                        s.include_compute, [s.inner[op.name]], s.ext)
    nest = run_nest(pu, s.cap, timer_u, op.loops)
    least = run_nest(pu, s.cap, timer_u, op.loops, "volume")
    un.time_s += nest.time_s
    un.compute_s += nest.compute_s
    for k, v in nest.terms.items():
        un.terms[k] = un.terms.get(k, 0.0) + v
    for k, v in nest.levels.items():
        un.levels[k] = un.levels.get(k, 0) + v
    for tn, v in nest.best.dm.items():
        un.volume[tn] = un.volume.get(tn, 0) + int(v)
    for tn, v in least.best.dm.items():
        un.least[tn] = un.least.get(tn, 0) + int(v)
    un.ops.append({
        "op": op.name, "order": list(nest.best.order), "tiles": nest.tiles,
        "tasks": int(nest.best.tasks), "memory_usage_bytes": int(nest.best.mu),
        "outer_level": s.names[outer_u], "volume": dict(nest.best.dm),
        "level_volume": nest.levels, "terms": nest.terms, "time_s": nest.time_s,
        "compute_s": nest.compute_s, "bound": nest.bound, "inner": nest.inner,
        "least_order": list(least.best.order), "least_tiles": least.tiles,
        "least_volume": dict(least.best.dm)})


def _reason(dev, s: _Setup, fp: _FusedPlans, un: _Unfused,
            inter_info: Sequence[Dict[str, Any]], fuse: bool) -> str:
    # -- reason ----------------------------------------------------------------------------------
    fused, least_f, tile_name, cap = fp.best, fp.least, s.tile_name, s.cap
    time_u, compute_u, vol_u = un.time_s, un.compute_s, un.volume
    parts = []
    for i in inter_info:
        dims = [v for v in i["shape"].values() if v > 1] or [1]
        shape = "x".join(str(v) for v in dims)
        parts.append(f"intermediate {i['name']} {shape} {i['dtype']} ({fmt_bytes(i['bytes'])}) "
                     f"{'fits' if i['fits_tile_level'] else 'does not fit'} {tile_name} "
                     f"({fmt_bytes(cap)} usable per core)")
    par_f = []
    for d in fused.best.order:
        if d not in fp.problem.parallel:
            break
        par_f.append(d)
    if not s.multi:
        parts.append("single op: nothing to fuse")
    else:
        lt_f, lt_u = least_f.volume, sum(un.least.values())
        parts.append(f"least traffic into {tile_name}: fused {fmt_bytes(lt_f)} vs unfused "
                     f"{fmt_bytes(lt_u)} ({saving(lt_f, lt_u)})")
        parts.append(f"best plans on {dev.num_units} cores: fused {fmt_bytes(fused.volume)} in "
                     f"{fmt_seconds(fused.time_s)} ({fused.best.tasks} tasks over "
                     f"{','.join(par_f) or 'nothing'}, bound by {fused.bound}) "
                     f"vs unfused {fmt_bytes(sum(vol_u.values()))} in {fmt_seconds(time_u)} "
                     f"({saving(fused.volume, sum(vol_u.values()))} of {tile_name} traffic)")
        if not s.include_compute:
            worst_f = max(fused.terms.values())
            if fused.compute_s > worst_f or compute_u > time_u:
                parts.append(f"note: ideal-peak compute ({fmt_seconds(fused.compute_s)} fused, "
                             f"{fmt_seconds(compute_u)} unfused) exceeds data movement: the chain "
                             f"is compute-bound and fusion may gain less")
        gain = 1 - fused.time_s / time_u if time_u else 0.0
        parts.append(f"fuse: {gain:.0%} faster" if fuse else
                     f"do not fuse: predicted gain {gain:.0%} < {1 - FUSE_THRESHOLD:.0%}")
    return "; ".join(parts)
