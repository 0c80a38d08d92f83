"""Shape variables read from tensor values, out of the dataflow blocks.

A mixture-of-experts layer reads its experts' row counts at run time (``tensor_to_shape`` and a
``match_cast`` defining shape variables: ``integrations.pytorch.moe_ops``). FuseOps re-emits a
dataflow block in the order of its variables and puts such a ``match_cast`` after the calls
whose types use its shape variables, which the VM then cannot allocate. Each read here becomes
its own (non-dataflow) binding block between the dataflow blocks before and after it, which
FuseOps keeps in place. Only functions with such reads are split; their variables all become
plain ones (``ToNonDataflow``), so an intermediate a fused group computes is also written out
(turning back into dataflow variables those used within their block alone is still to do).
"""
from __future__ import annotations

from typing import List

import tvm
from tvm import relax


def _reads_shape(binding) -> bool:
    value = binding.value
    if isinstance(binding, relax.MatchCast):
        return isinstance(binding.ty, relax.ShapeType)
    return isinstance(value, relax.Call) and getattr(value.op, "name", "") == \
        "relax.tensor_to_shape"


def _split(func: relax.Function) -> relax.Function:
    flat = relax.transform.ToNonDataflow()(tvm.IRModule({"f": func}))["f"]
    blocks: List[relax.BindingBlock] = []
    run: list = []
    reading = None
    for block in flat.body.blocks:
        for b in block.bindings:
            kind = _reads_shape(b)
            if reading is not None and kind != reading and run:
                blocks.append(relax.BindingBlock(run) if reading else relax.DataflowBlock(run))
                run = []
            reading = kind
            run.append(b)
    if run:
        blocks.append(relax.BindingBlock(run) if reading else relax.DataflowBlock(run))
    return relax.Function(flat.params, relax.SeqExpr(blocks, flat.body.body), flat.ret_ty,
                          flat.is_pure, flat.attrs)


def _has_reads(func: relax.Function) -> bool:
    body = func.body
    return isinstance(body, relax.SeqExpr) and any(
        _reads_shape(b) for block in body.blocks for b in block.bindings)


def shape_reads_pass() -> tvm.transform.Pass:
    """Every Relax function that reads shape variables from tensors, split as above."""

    @tvm.transform.module_pass(opt_level=0, name="RollerShapeReadsOutOfDataflow")
    def _rewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = mod.clone()
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function) and _has_reads(func):
                mod[gv] = _split(func)
        return relax.transform.Normalize()(mod)

    return _rewrite
