"""From a detected GEMM chain to a decision: fuse or not, and the row block a fused task takes.

The data-movement model (``movement``, Chimera's algorithm) chooses the loop order and tile sizes
and predicts the traffic of the fused kernel and of the operators run one by one; the chain is
fused when that predicts a gain. The fused CPU kernel realises the row-block order, so the row
tile (``m``) is what it takes from the plan.
"""
from __future__ import annotations

import math
from typing import List

from tvm_roller.backends.cpu.chain_lower import degenerate_tiles
from tvm_roller.backends.cpu.policy import L2_FILL
from tvm_roller.fusion import movement
from tvm_roller.fusion.chain import GemmChain
from tvm_roller.hardware import DeviceModel


def describe_loops(chain: GemmChain):
    """(the movement model's description of ``chain``, its row loop, its intermediate's column
    loop). A convolution chain (NHWC, rows: the output's w) is described as one, its input
    indexed by the output's h and w: read as a GEMM its K = kh x kw x C_in would count each
    input element kh x kw times."""
    if chain.producers and len(chain.window) == 3 and len(chain.batch) == 2:
        kh, kw, c_in = chain.window
        return (movement.conv_chain(chain.batch[0], chain.batch[1], chain.m, c_in, chain.l,
                                    chain.n, kh, kw, chain.elem_bytes), "w", "cm")
    return (movement.gemm_chain(math.prod(chain.batch), chain.m, chain.k, chain.l, chain.n,
                                chain.elem_bytes), "m", "l")


def plan_gemm_chain(chain: GemmChain, dev: DeviceModel):
    """The movement model's ChainPlan for ``chain`` on ``dev``.

    The fused kernel computes whole rows of the intermediate (a softmax between the matmuls
    needs them), so ``l`` is not tiled. The decision compares data movement only (Chimera's
    objective): a roofline with the compute term at the device's peak calls both versions
    compute-bound and hides the intermediate's round trip, which measurements show is what the
    unfused operators pay (BENCHMARKS.md, GEMM chains)."""
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
    decide(plan, dev, chain.intermediate_bytes, chain.row_reduction)
    if plan.fuse:
        why = degenerate_tiles(chain, rows_per_task(chain, plan, dev),
                               dev.simd_lanes(chain.dtype))
        if why:
            plan.fuse = False
            plan.reason += f"; not fused: {why} (the operators alone are padded)"
    return plan


def decide(plan, dev: DeviceModel, intermediate_bytes: int, row_reduction: bool = False) -> None:
    """Fuse when the intermediate does not fit the cores' private caches (otherwise the
    operators one by one keep it there too) and the fused order moves clearly less data from
    the shared level, and still keeps every core busy.

    The volumes compared are the model's least-traffic plans (Chimera's objective) between the
    shared level and the private caches: the model's largest time term is the same L1
    micro-kernel traffic in both versions and would hide the difference."""
    private = dev.levels[1]
    # each core keeps its share of the rows; half its L2 is what a tile may use (policy.L2_FILL)
    cap = private.capacity_bytes * L2_FILL
    share = intermediate_bytes / max(1, dev.num_units)
    fits = share <= cap
    pass_of_its_own = 0
    if row_reduction and not fits:  # the softmax reads C and writes S from the shared level
        pass_of_its_own = 2 * intermediate_bytes
        plan.least_total_unfused += pass_of_its_own
        plan.total_unfused += pass_of_its_own
    vf, vu = plan.least_total_fused, plan.least_total_unfused
    saving = 100.0 * (1 - vf / vu) if vu else 0.0
    busy = plan.tasks >= dev.num_units
    plan.fuse = not fits and vf < 0.95 * vu and busy
    why = []
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
