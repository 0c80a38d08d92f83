"""Constant operands packed while compiling (``backends.cpu.prepack``): the passes around
roller's scheduling that make it happen.

Before scheduling, each PrimFunc's ``layout_free_buffers`` attribute lists the parameters every
one of its calls binds to a constant (a model's weights; not the weights a caller passes as
inputs, which would be packed in every call); roller's tiled kernels pack such an operand in one block marked
for layout rewriting. After scheduling, ``SplitLayoutRewritePreproc`` moves those blocks into
functions of their own (the kernel becomes ``<name>_prepacked``), ``FoldConstant`` runs them
on the constants and dead code goes. The report's entries follow their kernels' new names.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import tvm
from tvm import relax, s_tir, tirx

from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.backends.cpu.prepack import PREPROC

#: the suffix SplitLayoutRewritePreproc gives a kernel whose packing it split off
PREPACKED = "_prepacked"


def constant_operands(mod: tvm.IRModule) -> Dict[str, List[int]]:
    """PrimFunc name -> the argument positions every ``call_tir`` of it binds to a constant."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    seen: Dict[str, Optional[set]] = {}
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for block in getattr(func.body, "blocks", []):
            for binding in block.bindings:
                call = binding.value
                if not (isinstance(call, relax.Call) and call.op.same_as(call_tir)):
                    continue
                name = call.args[0].name_hint
                const = {i for i, a in enumerate(call.args[1].fields)
                         if isinstance(a, tvm.ir.expr.GenericConst)}
                seen[name] = const if name not in seen else seen[name] & const
    return {k: sorted(v) for k, v in seen.items() if v}


def mark_constant_operands() -> tvm.transform.Pass:
    """Before scheduling: each PrimFunc's constant-bound parameters listed (see above)."""

    @tvm.transform.module_pass(opt_level=0, name="RollerMarkConstantOperands")
    def _mark(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        for name, positions in constant_operands(mod).items():
            gv = mod.get_global_var(name)
            func = mod[gv]
            if isinstance(func, tirx.PrimFunc):
                mod[gv] = func.with_attr("layout_free_buffers", positions)
        return mod

    return _mark


def _packs(func: tirx.PrimFunc) -> bool:
    """Whether a kernel holds a packing block (``backends.cpu.prepack``)."""
    found = []

    def visit(node) -> None:
        ann = getattr(node, "annotations", None) if isinstance(node, s_tir.SBlock) else None
        if ann is not None and PREPROC in ann:
            found.append(node)

    post_order_visit(func.body, visit)
    return bool(found)


def _split(mod: tvm.IRModule, gv: tvm.ir.GlobalVar) -> tvm.IRModule:
    """``mod`` with kernel ``gv``'s packing split off. TVM's pass visits every PrimFunc and
    rejects some it need not touch (a cumsum's opaque block): it sees the Relax functions and
    this kernel alone, the rest is put back after."""
    others = {g: f for g, f in mod.functions_items()
              if isinstance(f, tirx.PrimFunc) and not g.same_as(gv)}
    part = tvm.IRModule({g: f for g, f in mod.functions_items() if g not in others},
                        attrs=mod.attrs)
    part = relax.transform.SplitLayoutRewritePreproc()(part)
    for g, f in others.items():
        part[g] = f
    return part


def _unmarked(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The kernel with its packing blocks left in place (run in every call)."""
    sch = s_tir.Schedule(func)
    names = []
    post_order_visit(func.body, lambda n: names.append(n.name_hint) if isinstance(
        n, s_tir.SBlock) and PREPROC in n.annotations else None)
    for name in names:
        sch.unannotate(sch.get_sblock(name), PREPROC)
    return sch.mod["main"].without_attr("layout_free_buffers")


def fold_packing(report: Optional[list] = None) -> tvm.transform.Pass:
    """After scheduling: the packing blocks split off and run at compile time (see above)."""

    @tvm.transform.module_pass(opt_level=0, name="RollerFoldPacking")
    def _fold(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        failed: Dict[str, str] = {}
        for gv in [gv for gv, f in mod.functions_items()
                   if isinstance(f, tirx.PrimFunc) and _packs(f)]:
            try:
                mod = _split(mod, gv)
            except RuntimeError as err:  # TVM's errors: reported, the kernel packs per call
                failed[gv.name_hint] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                mod[gv] = _unmarked(mod[gv])
        mod = tvm.transform.Sequential([relax.transform.FoldConstant(),
                                        relax.transform.DeadCodeElimination()])(mod)
        if report is not None:
            names = {gv.name_hint for gv in mod.get_global_vars()}
            for e in report:
                if e["name"] in failed:
                    e["reason"] = ("packing left in the kernel: splitting it off failed: "
                                   + failed[e["name"]])
                elif e["name"] not in names and e["name"] + PREPACKED in names:
                    e["name"] += PREPACKED
                    e["prepacked"] = True
        return mod

    return _fold
