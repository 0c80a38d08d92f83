"""Weight-only quantization of an exported LM (``compile(weights="int8" | "int4")``): the same
decision for each weight in ``prefill`` and ``decode`` (a weight both read as linear layers or
embedding lookups, whose shape the format takes), both functions rewritten onto roller's
integer kernels (``relax.passes.quantize_weights``), and the weights packed once, in the
functions' parameter order (a quantized weight becomes its words and its scales)."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import tvm

from tvm_roller.backends.cpu.quant_format import QuantFormat, quantize_packed
from tvm_roller.integrations.relax.passes.quantize_weights import QuantDecision, \
    param_decisions, quantize_params, weight_entries


def joint_decisions(mods: Dict[str, tvm.IRModule], names: Sequence[str],
                    fmt: QuantFormat) -> List[QuantDecision]:
    """A weight is quantized when every function can take it quantized (the first function's
    reason otherwise); one no function reads (a tied table's second name) is dropped."""
    per_func = [param_decisions(mod[name], fmt, names, mod) for name, mod in mods.items()]
    return [_joint(ds) for ds in zip(*per_func)]


def _joint(decisions: Sequence[QuantDecision]) -> QuantDecision:
    used = [d for d in decisions if not d.unused]
    if not used:
        return decisions[0]
    return next((d for d in used if d.reason is not None), used[0])


def quantize_lm(mods: Dict[str, tvm.IRModule], names: Sequence[str], tensors: Sequence,
                fmt: QuantFormat, report: list) -> Tuple[Dict[str, tvm.IRModule], tuple]:
    """``mods`` (function name -> the module holding it) rewritten, and the weight tensors
    (torch, in parameter order) with each quantized one replaced by its words and scales
    (numpy arrays).
    ``report`` gets the kernels and one entry per weight (kept float32: with the reason)."""
    decisions = joint_decisions(mods, names, fmt)
    out = {name: quantize_params(mod, name, decisions, fmt, report, prefix=f"{name}_")
           for name, mod in mods.items()}
    report.extend(weight_entries(decisions))
    packed: list = []
    for d, t in zip(decisions, tensors):
        if d.unused:
            continue
        if d.reason is not None:
            packed.append(t)
            continue
        packed += list(quantize_packed(fmt, t.detach().float().numpy()))
    return out, tuple(packed)
