"""Chimera in a Relax graph: each matmul -> ... -> matmul chain grouped into one primitive
function when the backend's data-movement model says fusing it pays (``passes.chains`` finds
and groups them; the planner then schedules the group as one fused kernel)."""
from __future__ import annotations

import logging
from typing import Optional

import tvm
from tvm import relax

from tvm_roller.backends.registry import backend_for, has_backend
from tvm_roller.core.errors import UnsupportedError, first_lines
from tvm_roller.fusion.chain import GemmChain
from tvm_roller.hardware import DeviceModel
from tvm_roller.integrations.relax.passes.chains import chain_shape, group_gemm_chains, \
    reduces_rows

logger = logging.getLogger("tvm_roller")


def group_chains_pass(device: Optional[DeviceModel] = None,
                      decisions: Optional[list] = None) -> tvm.transform.Pass:
    """Group each matmul -> ... -> matmul chain of every Relax function into one primitive
    function (``passes.chains``) when roller's data-movement model says fusing it pays on
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
            reason = f"error: {type(err).__name__}: {first_lines(err)}"
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
