"""From a detected GEMM chain to a decision: fuse or not, the row block a fused task takes and
the tiles of its matmuls.

The data-movement model (``movement``, Chimera's algorithm) chooses the loop order and the row
block and predicts the traffic of the fused kernel and of the operators run one by one from the
shared level. The times come from roller's single-operator model: each matmul of a fused task is
tiled by the CPU policy for the task's share of it and predicted at the calibrated rate of its
register tile; the operators one by one are predicted from their own plans. The chain is fused
when the fused time is lower by a margin.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from tvm_roller.analysis import FuncAnalysis, analyze
from tvm_roller.backends.cpu.chain_lower import OpTiles, degenerate_tiles, padded_columns
from tvm_roller.backends.cpu.perf_model import LAUNCH_OVERHEAD_S, TASK_OVERHEAD_S
from tvm_roller.backends.cpu.policy import L2_FILL, construct_streaming, construct_tiled
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.fusion import movement, operators
from tvm_roller.fusion.chain import GemmChain
from tvm_roller.hardware import DeviceModel

# roller's own plan of one analysed operator alone on a device (its best rTile), by the
# backend's rules
PlanAlone = Callable[[FuncAnalysis, DeviceModel], RTile]


def describe_loops(chain: GemmChain):
    """(the movement model's description of ``chain``, its row loop, its intermediate's column
    loop). A convolution chain (NHWC, rows: the output's w) is described as one, its input
    indexed by the output's h and w: read as a GEMM its K = kh x kw x C_in would count each
    input element kh x kw times."""
    if chain.is_conv:
        kh, kw, c_in = chain.window
        return (movement.conv_chain(chain.batch[0], chain.batch[1], chain.m, c_in, chain.l,
                                    chain.n, kh, kw, chain.elem_bytes), "w", "cm")
    return (movement.gemm_chain(math.prod(chain.batch), chain.m, chain.k, chain.l, chain.n,
                                chain.elem_bytes), "m", "l")


def plan_gemm_chain(chain: GemmChain, dev: DeviceModel, plan_alone: PlanAlone
                    ) -> Tuple[object, Optional["ChainTimes"]]:
    """The movement model's ChainPlan for ``chain`` on ``dev``, with the decision read from
    predicted times (``decide``), and the predicted times (None, and not fused, when an
    operator cannot be planned alone). ``plan_alone``: roller's own plan of one operator (the
    backend's rules), what the operators one by one would run.

    The fused kernel computes whole rows of the intermediate (a softmax between the matmuls
    needs them), so ``l`` is not tiled. The movement model sizes the row blocks and gives the
    traffic from the shared level; the time each side takes at this machine's calibrated rates
    comes from the single-operator model (``predict_times``)."""
    def describe_chain(whole_rows: bool):
        desc, _, cols = describe_loops(chain)
        for loop in desc.loops:
            loop.untiled = loop.untiled or (whole_rows and loop.name == cols)
        return desc

    plan = movement.plan_chain(describe_chain(True), dev, include_compute=False)
    # the operators one by one may tile l as they like: their figures come from a plan without
    # the whole-rows constraint
    alone = movement.plan_chain(describe_chain(False), dev, include_compute=False)
    for name in vars(plan):
        if "unfused" in name:
            setattr(plan, name, getattr(alone, name))
    rows = rows_per_task(chain, plan, dev)
    try:
        times = predict_times(chain, plan, dev, rows, plan_alone)
    except UnsupportedError as err:  # an operator roller cannot plan alone: nothing to compare
        plan.fuse = False
        plan.reason = f"not fused: the chain's operators cannot be predicted alone ({err})"
        return plan, None
    decide(plan, dev, chain.intermediate_bytes, times, chain.row_reduction)
    if plan.fuse:
        why = degenerate_tiles(chain, rows, dev.simd_lanes(chain.dtype))
        if why:
            plan.fuse = False
            plan.reason += f"; not fused: {why} (the operators alone are padded)"
    return plan, times


@dataclass(frozen=True)
class ChainTimes:
    """Predicted seconds of the fused kernel and of the operators one by one (plain data), and
    the fused kernel's tiles for each matmul inside a task (roller's single-operator policy on
    the task's share of it: the fused micro-kernel runs at the operators' own rate)."""

    fused_s: float
    unfused_s: float
    fused_terms: Dict[str, float]  # "in-core" (the tasks' matmuls and stages), shared levels
    unfused_terms: Dict[str, float]  # per operator, and the intermediate's round trip
    tiles: Tuple[Optional[OpTiles], Optional[OpTiles]]
    constants: str  # where the rates came from (the device model's source)

    def lines(self) -> List[str]:
        def terms(d: Dict[str, float]) -> str:
            return ", ".join(f"{k} {1e3 * v:.3f}" for k, v in d.items())
        return [f"predicted fused {1e3 * self.fused_s:.3f} ms ({terms(self.fused_terms)})",
                f"predicted unfused {1e3 * self.unfused_s:.3f} ms ({terms(self.unfused_terms)})",
                f"constants: {self.constants}"]


# each time an intermediate moves through the shared level: written (the line read for
# ownership, then written back) and read by the next operator
_SPILL_PASSES = 3


def _fits_private(intermediate_bytes: int, dev: DeviceModel) -> Tuple[bool, float, float]:
    """(whether each core's share of the intermediate fits its L2, the share, the usable
    capacity): each core keeps its share of the rows; half its L2 is what a tile may use
    (``policy.L2_FILL``)."""
    cap = dev.levels[1].capacity_bytes * L2_FILL
    share = intermediate_bytes / max(1, dev.num_units)
    return share <= cap, share, cap


def _one_core(dev: DeviceModel) -> DeviceModel:
    """``dev`` as one fused task sees it: one core with its own peak (the rates per core)."""
    return dataclasses.replace(dev, num_units=1, peak_gflops={
        k: v / max(1, dev.num_units) for k, v in dev.peak_gflops.items()})


def _in_core(t: RTile) -> float:
    """A task's time on its core: its largest term among compute and the private levels (the
    task's operands come from the shared level once: the movement model counts that)."""
    return max(v for k, v in t.terms.items() if k in ("compute", "L1", "L2"))


def _op_tiles(fa, t: RTile) -> Optional[OpTiles]:
    """``t``'s tiles along the task's rows, columns and reductions (None when its vector axis
    is not the output's columns)."""
    rows_ax, cols_ax = fa.spatial[-2], fa.spatial[-1]
    if fa.vector_axis != cols_ax:
        return None
    return OpTiles(t.reg[rows_ax], t.reg[cols_ax], t.l1[rows_ax], t.l1[cols_ax],
                   tuple(t.l1[r] for r in fa.reduction), t.acc_level == "reg")


def _task_tile(func, dev1: DeviceModel, plan_alone: PlanAlone, lanes: int
               ) -> Tuple[Optional[OpTiles], RTile]:
    """Roller's tile for one task's share of a matmul, as the fused kernel's OpTiles, and the
    rTile with its predicted terms: the operator's own rule planning the share alone on one
    core, or, when that tile pads an axis (the fused kernel does not pad inside a task), the
    tiled policy with exact divisors."""
    fa = analyze(func)
    rows, cols = (fa.axes[i].extent for i in fa.spatial[-2:])
    reductions = [fa.axes[i].extent for i in fa.reduction]
    t = plan_alone(fa, dev1)
    tiles = _op_tiles(fa, t)
    if tiles is not None and tiles.fits(rows, cols, reductions, lanes):
        return tiles, t
    t = construct_tiled(fa, dev1, pad_eps=0.0)[0]
    return _op_tiles(fa, t), t


def predict_times(chain: GemmChain, plan, dev: DeviceModel, rows: int,
                  plan_alone: PlanAlone) -> ChainTimes:
    """Fused: every task runs the first matmul, the stages and the second matmul on its
    ``rows`` rows, each at the rate roller's own tile for that share reaches on one core (the
    calibrated micro-kernel table), the tasks in waves over the cores; against the shared
    level's traffic the movement model predicts for the fused order (the larger bounds).
    Unfused: the operators' own plans in turn, plus the intermediate's round trips through
    memory when it does not fit the cores' private caches (a write-back and a read per
    operator boundary, at DRAM bandwidth: a shared cache holds it only if the other tenants
    leave it alone, which the measurements on this VM say they do not)."""
    lanes = dev.simd_lanes(chain.dtype)
    dev1 = _one_core(dev)
    tasks = math.prod(chain.batch) * (chain.m // rows)
    waves = -(-tasks // dev.num_units)
    task_chain = dataclasses.replace(chain, l=padded_columns(chain.l, lanes))
    t1, r1 = _task_tile(operators.first_operator(task_chain, rows), dev1, plan_alone, lanes)
    t2, r2 = _task_tile(operators.second_operator(task_chain, rows), dev1, plan_alone, lanes)
    per_task = _in_core(r1) + _in_core(r2)
    stage = operators.row_stage(chain, rows)
    if stage is not None:
        per_task += _in_core_streaming(stage, dev1)
    shared_names = {lv.name for lv in dev.levels if lv.shared} | {dev.dram.name}
    shared = {k: v for k, v in plan.terms_fused.items() if k.split("<-")[-1] in shared_names}
    fused_terms = {"in-core": waves * per_task, **shared}
    fused = max(fused_terms.values()) + LAUNCH_OVERHEAD_S + TASK_OVERHEAD_S * waves

    own = [("first", plan_alone(analyze(operators.first_operator(chain)), dev))]
    full_stage = operators.row_stage(chain)
    if full_stage is not None:
        own.append(("row stage", plan_alone(analyze(full_stage), dev)))
    own.append(("second", plan_alone(analyze(operators.second_operator(chain)), dev)))
    unfused_terms = {name: t.predicted_s for name, t in own}
    if not _fits_private(chain.intermediate_bytes, dev)[0]:
        boundaries = len(own) - 1
        unfused_terms["round trips"] = (_SPILL_PASSES * boundaries * chain.intermediate_bytes /
                                        (dev.dram.bandwidth_gbs * 1e9))
    return ChainTimes(fused, sum(unfused_terms.values()), fused_terms, unfused_terms,
                      (t1, t2), dev.source)


def _in_core_streaming(func, dev1: DeviceModel) -> float:
    t = construct_streaming(analyze(func), dev1)[0]
    return max(t.terms.values())


# fuse only when the fused prediction is below this share of the unfused one: measured, the
# fused/unfused ratio came out up to 0.1 above its prediction for the chains that fuse nearly
# even (convolution chains, attention at 128 tokens: predicted 0.90-0.98), and it moves by
# about as much run to run on a shared VM (docs/history.md, "Chimera fusion by predicted time")
FUSE_MARGIN = 0.85


def decide(plan, dev: DeviceModel, intermediate_bytes: int, times: ChainTimes,
           row_reduction: bool = False) -> None:
    """Fuse when the predicted fused time is below ``FUSE_MARGIN`` x the operators' one by
    one. The reason also states the traffic from the shared level (Chimera's least-traffic
    plans, fused and unfused) and whether the intermediate fits the private caches."""
    private = dev.levels[1]
    fits, share, cap = _fits_private(intermediate_bytes, dev)
    pass_of_its_own = 0
    if row_reduction and not fits:  # the softmax reads C and writes S from the shared level
        pass_of_its_own = 2 * intermediate_bytes
        plan.least_total_unfused += pass_of_its_own
        plan.total_unfused += pass_of_its_own
    vf, vu = plan.least_total_fused, plan.least_total_unfused
    saving = 100.0 * (1 - vf / vu) if vu else 0.0
    ratio = times.fused_s / times.unfused_s if times.unfused_s else 1.0
    plan.fuse = ratio < FUSE_MARGIN
    why = [f"predicted fused {1e3 * times.fused_s:.3f} ms vs unfused "
           f"{1e3 * times.unfused_s:.3f} ms ({ratio:.2f}x; fused only below {FUSE_MARGIN:g}x)"]
    if fits:
        why.append(f"each core's share of the intermediate ({share / 2**20:.2f} MiB) fits its "
                   f"{private.name} ({cap / 2**20:.2f} MiB usable): unfused keeps it there too")
    change = f"{saving:.0f}% less" if saving >= 0 else f"{-saving:.0f}% more"
    own = (f", of which {pass_of_its_own / 2**20:.1f} MiB for the row reduction's own pass"
           if pass_of_its_own else "")
    why.append(f"least traffic from the shared level: fused {vf / 2**20:.1f} MiB vs unfused "
               f"{vu / 2**20:.1f} MiB{own} ({change})")
    why.append(f"{plan.tasks} parallel row blocks on {dev.num_units} cores")
    plan.reason = "; ".join(why)


def rows_per_task(chain: GemmChain, plan, dev: DeviceModel) -> int:
    """The plan's row tile, made a divisor of m, and small enough that every core gets tasks."""
    want = max(1, int(plan.tiles.get(describe_loops(chain)[1], chain.m)))
    batch = math.prod(chain.batch)
    divisors = [d for d in range(1, chain.m + 1) if chain.m % d == 0]
    rows = max(d for d in divisors if d <= want)
    while rows > 1 and batch * (chain.m // rows) < dev.num_units:
        rows = max(d for d in divisors if d < rows)
    return rows


def describe(plan) -> List[str]:
    """The movement model's plan as lines for ``tvm_roller.explain``."""
    return ["  " + line for line in movement.format_plan(plan).splitlines()]
