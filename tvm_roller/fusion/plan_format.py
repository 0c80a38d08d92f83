"""A chain plan as text: the lines ``tvm_roller.explain`` prints, and the byte and time units
its reason uses."""
from __future__ import annotations

from tvm_roller.fusion.chain_plan import ChainPlan


def fmt_bytes(b: float) -> str:
    """Bytes in the largest binary unit that fits (``1.5 MiB``)."""
    b = float(b)
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b / s:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_seconds(s: float) -> str:
    """Seconds in ms, or in us below a millisecond."""
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def saving(fused: float, unfused: float) -> str:
    """What the fused volume or time saves over the unfused one, in words."""
    if not unfused:
        return "n/a"
    s = 1 - fused / unfused
    return f"saves {s:.0%}" if s >= 0 else f"{-s:.0%} more"


def format_plan(plan: ChainPlan) -> str:
    """Lines for ``tvm_roller.explain``: decision, order, tiles, volumes per tensor and level."""
    roles = {t["name"]: t["role"] for t in plan.chain["tensors"]}
    ext = {lp["name"]: lp["extent"] for lp in plan.chain["loops"]}

    def loops(order):
        return " ".join(d for d in order if ext[d] > 1)

    def tiles(t, order):
        return ", ".join(f"{d}={t[d]}/{ext[d]}" for d in order if d in t and ext[d] > 1)

    lines = [f"chain {plan.chain.get('name') or ''}: {'FUSE' if plan.fuse else 'do not fuse'} "
             f"(Chimera data-movement model, {plan.device})",
             f"  reason: {plan.reason}",
             f"  fused blocks sized for {plan.tile_level} ({fmt_bytes(plan.tile_capacity_bytes)} "
             f"usable per core, MU {fmt_bytes(plan.memory_usage_bytes)}), streamed from "
             f"{plan.outer_level}; {plan.tasks} parallel tasks",
             f"  fused order (outer->inner): {loops(plan.order)}; tiles "
             f"{tiles(plan.tiles, plan.order)}"]
    for info in plan.inner:
        lines.append(f"    {info['op']} block re-tiled for {info['level']}: order "
                     f"{loops(info['order'])}; tiles {tiles(info['tiles'], info['order'])}")
    for u in plan.unfused_ops:
        lines.append(f"  unfused {u['op']}: order {loops(u['order'])}; tiles "
                     f"{tiles(u['tiles'], u['order'])}; {u['tasks']} tasks, "
                     f"{fmt_seconds(u['time_s'])} "
                     f"(bound by {u['bound']})")
    lines.append(f"  least-traffic fused order: {loops(plan.least_order)}; tiles "
                 f"{tiles(plan.least_tiles, plan.least_order)}")
    lines.append(f"  volume into {plan.tile_level} per tensor: best fused | best unfused || "
                 f"least fused | least unfused")
    for name in plan.volume_unfused:
        lines.append(f"    {name:<6s} {roles.get(name, ''):<12s} "
                     f"{fmt_bytes(plan.volume_fused.get(name, 0)):>10s} | "
                     f"{fmt_bytes(plan.volume_unfused[name]):>10s} || "
                     f"{fmt_bytes(plan.least_volume_fused.get(name, 0)):>10s} | "
                     f"{fmt_bytes(plan.least_volume_unfused.get(name, 0)):>10s}")
    lines.append(f"    {'total':<19s} {fmt_bytes(plan.total_fused):>10s} | "
                 f"{fmt_bytes(plan.total_unfused):>10s} || "
                 f"{fmt_bytes(plan.least_total_fused):>10s} | "
                 f"{fmt_bytes(plan.least_total_unfused):>10s}")
    keys = list(dict.fromkeys(list(plan.terms_fused) + list(plan.terms_unfused)))
    lines.append("  per level, fused | unfused:")
    for k in keys:
        if k == "compute":
            continue
        lines.append(f"    {k:<10s} {fmt_bytes(plan.level_volume_fused.get(k, 0)):>10s} "
                     f"{fmt_seconds(plan.terms_fused.get(k, 0.0)):>9s} | "
                     f"{fmt_bytes(plan.level_volume_unfused.get(k, 0)):>10s} "
                     f"{fmt_seconds(plan.terms_unfused.get(k, 0.0)):>9s}")
    lines.append(f"    {'compute':<10s} {fmt_seconds(plan.compute_fused_s):>21s} | "
                 f"{fmt_seconds(plan.compute_unfused_s):>20s}"
                 + ("" if plan.include_compute else "  (not a term)"))
    lines.append(f"  predicted: fused {fmt_seconds(plan.time_fused_s)} "
                 f"(bound by {plan.bound_fused}), unfused {fmt_seconds(plan.time_unfused_s)}")
    return "\n".join(lines)
