"""``explain``'s text: a plan's rTiles per level, alignment, prediction and chain decision; a
decomposed function's parts; a function with symbolic extents' buckets."""
from __future__ import annotations

from typing import List, Optional

from tvm_roller.fusion.chain import GemmChain
from tvm_roller.fusion.decision import ChainDecision
from tvm_roller.planner.buckets import DynamicPlan, describe
from tvm_roller.planner.plan import Plan


def explain_plan(p: Plan) -> str:
    """The account of a static function's plan (a decomposed one: why, and each part's)."""
    lines = [f"target: {p.target}"]
    lines += [f"  note: {n}" for n in p.target_notes]
    lines.append(p.backend.describe_device(p.device))
    if not p.parts:
        return "\n".join(lines + plan_lines(p))
    fa, dec = p.decomposed.whole, p.decomposed
    lines.append(f"main block: {fa.main}, dtype {fa.dtype}, {fa.flops / 1e6:.2f} MFLOP as "
                 "written")
    lines.append(f"{dec.decomposition.reason}")
    lines += [f"  note: {n}" for n in dec.decomposition.notes]
    flops = sum(part.analysis.flops for part in p.parts if part.analysis.kind != "elementwise")
    lines.append(f"{len(p.parts)} parts, planned one by one and stitched into one function "
                 f"({flops / 1e6:.2f} MFLOP of reductions left); predicted "
                 f"{p.predicted_s * 1e6:.1f} us in all; construction {p.construct_s * 1e3:.1f} ms")
    for i, (part, label) in enumerate(zip(p.parts, dec.decomposition.labels)):
        lead = " (lead: the plan's candidates are its tiles)" if i == dec.lead else ""
        lines.append(f"part {i + 1}/{len(p.parts)}: {label}{lead}")
        lines += ["  " + line for line in plan_lines(part, construction=False,
                                                      candidates=None if lead else 1)]
    return "\n".join(lines)


def explain_dynamic(dp: DynamicPlan) -> str:
    """The buckets, each bucket's plan, and the largest bucket's plan in full."""
    top = dp.cases[-1]
    return "\n".join([f"target: {dp.target}"] + describe(dp) +
                     [f"largest bucket ({top.label()}), at {dict(top.planned_at)}:"] +
                     ["  " + line for line in plan_lines(top.plan)])


def plan_lines(p: Plan, construction: bool = True,
               candidates: Optional[int] = None) -> List[str]:
    fa, best = p.analysis, p.tiles[0]
    lines = [f"main block: {fa.main} ({best.kind}, rule {p.rule.name}), dtype {fa.dtype}, "
             f"{fa.flops / 1e6:.2f} MFLOP"]
    lines.append("axes: " + ", ".join(f"{a.name}={a.extent}{a.kind}" for a in fa.axes))
    if fa.vector_axis is not None:
        lines.append(f"vector axis: {fa.axes[fa.vector_axis].name}")
    if construction:
        lines.append(f"construction: {p.construct_s * 1e3:.1f} ms, {len(p.tiles)} candidate(s)")
    for rank, t in enumerate(p.tiles[:candidates]):
        lines.append(f"#{rank + 1}: predicted {t.predicted_s * 1e6:.1f} us, bound by {t.bound}, "
                     f"{t.num_tasks} parallel tasks")
        lines += p.rule.describe(t)
        lines.append("    terms (s): " + ", ".join(f"{k}={v:.3g}" for k, v in t.terms.items()))
    lines += [f"alignment: {n}" for n in best.notes]
    if p.chain is not None:
        lines += _describe_chain(p.chain, p.fusion)
    return lines


def _describe_chain(chain: GemmChain, d: ChainDecision) -> List[str]:
    mid = " -> ".join(chain.between) if chain.between else "nothing"
    return [f"GEMM chain: {chain.first} ({chain.m}x{chain.k} . {chain.k}x{chain.l}) -> {mid} -> "
            f"{chain.second} (. {chain.l}x{chain.n}), batch {chain.batch or [1]}; intermediate "
            f"{chain.intermediate_bytes / 2**20:.2f} MiB",
            f"decision: {'fused' if d.fuse else 'not fused (operators one by one)'}: {d.reason}",
            *d.lines]
