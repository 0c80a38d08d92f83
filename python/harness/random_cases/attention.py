"""The attention family: HF's eager attention as a Relax model, its inputs and its float64 numpy
reference (``check_cpu`` compiles it with ``tvm_roller.relax.compile`` and compares).

The model is what ``transformers`` writes and ``torch.export`` imports: ``matmul(Q,
permute_dims(K))``, a multiply or divide by a scalar constant (or none), an additive mask or
bias, a softmax over the keys and ``matmul(·, V)``; K and V repeated over the query heads by
``repeat_kv`` (expand_dims, broadcast_to, reshape) for GQA and MQA, or MQA's one head broadcast
by the matmul. The ``form`` is the operands at rank 4; each matmul between the rank-3 views the
import makes (the output then transposed to ``[b, sq, h * d]``); or the heads folded into a
rank-3 batch. roller's flash-attention pass (``integrations/relax/passes/flash_attention.py``)
makes it one kernel or leaves it to the matmul-chain fusion, saying why in ``chains``: the
result's facts carry that decision (``attention``), which is reported, never a failure.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relax

from harness.random_cases import compare, families
from harness.random_cases.case import Case, Param

FLASH = "flash attention kernel"  # the pass's reason when it made the kernel
NOT_MATCHED = "not matched by the flash-attention pass"
Shape = Tuple[int, ...]


class KernelFellBack(RuntimeError):
    """roller failed on a function of the model and the pipeline fell back to TVM's default
    for it: a defect, as an exception in a PrimFunc case's build is."""


def _ints(p: Mapping[str, Param], *names: str) -> List[int]:
    return [int(p[n]) for n in names]


def shapes(p: Mapping[str, Param]) -> Dict[str, Shape]:
    """The inputs' shapes: ``q``, ``k``, ``v`` and, with a mask, ``mask``."""
    b, h, kvh, hd, sq, sk = _ints(p, "B", "H", "KVH", "D", "SQ", "SK")
    mask = families.attention_mask_shape(p)
    if p["form"] == "folded":  # MHA only: one kv head per query head
        out = {"q": (b * h, sq, hd), "k": (b * h, sk, hd), "v": (b * h, sk, hd)}
        if mask is not None:
            out["mask"] = (mask[0] * mask[1], *mask[2:])
        return out
    out = {"q": (b, h, sq, hd), "k": (b, kvh, sk, hd), "v": (b, kvh, sk, hd)}
    if mask is not None:
        out["mask"] = mask
    return out


def reduction(p: Mapping[str, Param]) -> int:
    """The terms behind each output element: the head size's in each score, then the keys' in
    the weighted sum. Their errors add rather than multiply (as a matmul chain's, ``K x L``):
    the softmax's weights sum to one."""
    return int(p["D"]) + int(p["SK"])


# -- the inputs ----------------------------------------------------------------------------------
def _masked(p: Mapping[str, Param], rng: np.random.Generator) -> np.ndarray:
    """Where the mask (``[bb, 1, rows, sk]``) is the fill value. Without ``empty`` every row
    keeps a key; with it some row is masked everywhere."""
    kind, empty = str(p["mask"]), bool(p.get("empty", 0))
    bb, _, rows, sk = families.attention_mask_shape(p)
    sq = int(p["SQ"])
    if kind == "random":  # also keys masked for every query
        masked = rng.random((bb, 1, rows, sk)) < 0.3
        full = masked.all(-1)
        masked[full, rng.integers(0, sk, size=int(full.sum()))] = False
        if empty:
            masked[rng.integers(0, bb), 0, rng.integers(0, rows)] = True
        return masked
    # HF's causal mask: the queries are the last sq positions; key j is after query i's own
    later = np.arange(sk)[None, :] > np.arange(sk - sq, sk)[:, None]
    if kind == "causal":
        return np.broadcast_to(later, (bb, 1, sq, sk))
    if kind == "padding":  # right or left padding, never a whole entry unless ``empty``
        pads = rng.integers(0, sk, size=bb)
        if empty:
            pads[rng.integers(0, bb)] = sk
        pos = np.arange(sk) if rng.random() < 0.5 else np.arange(sk)[::-1]
        return (pos[None, :] < pads[:, None])[:, None, None, :]
    # causal and left padding combined: a query whose window is all padding is masked
    # everywhere, so without ``empty`` no entry pads past the first query's window
    pads = rng.integers(0, max(0, sk - sq) + 1, size=bb)
    if empty:
        pads[rng.integers(0, bb)] = rng.integers(max(0, sk - sq + 1), sk + 1)
    return later[None, None] | (np.arange(sk)[None, :] < pads[:, None])[:, None, None, :]


def mask_values(case: Case) -> Optional[np.ndarray]:
    """The additive mask at rank 4 (seeded by the case): 0 where attended and the fill value
    (the dtype's minimum, as HF's ``torch.finfo(dtype).min``, or a large negative number)
    where masked; a per-head bias is Uniform(-2, 2)."""
    p = case.params
    shape = families.attention_mask_shape(p)
    if shape is None:
        return None
    rng = np.random.default_rng([case.seed, case.index, 4])
    if p["mask"] == "head_bias":
        return rng.uniform(-2.0, 2.0, size=shape).astype(case.dtype)
    fill = np.finfo(case.dtype).min if p["fill"] == "min" else float(p["fill"])
    return np.where(_masked(p, rng), fill, 0.0).astype(case.dtype)


def inputs(case: Case) -> List[np.ndarray]:
    """q, k, v Uniform(-1, 1) and never zero (``compare.random_arrays``), then the mask."""
    sh = shapes(case.params)
    arrays = compare.random_arrays(case, [(sh[n], case.dtype) for n in ("q", "k", "v")])
    mask = mask_values(case)
    return arrays if mask is None else arrays + [mask.reshape(sh["mask"])]


# -- the model -----------------------------------------------------------------------------------
def _dims(expr: relax.Expr) -> List[int]:
    return [int(d) for d in expr.ty.shape]


def _repeat_kv(bb: relax.BlockBuilder, x: relax.Expr, heads: int) -> relax.Expr:
    """HF's ``repeat_kv``: ``x[:, :, None].expand(b, kvh, rep, s, d).reshape(b, h, s, d)``."""
    b, kvh, s, d = _dims(x)
    wide = bb.emit(relax.op.broadcast_to(bb.emit(relax.op.expand_dims(x, 2)),
                                         (b, kvh, heads // kvh, s, d)))
    return bb.emit(relax.op.reshape(wide, (b, heads, s, d)))


def _matmul(bb: relax.BlockBuilder, a: relax.Expr, b: relax.Expr, views: bool) -> relax.Expr:
    """``a . b``; with ``views`` as torch.export imports a rank-4 matmul: both operands
    broadcast to the common batch and reshaped to rank 3, the product reshaped back."""
    if not views:
        return bb.emit(relax.op.matmul(a, b))
    da, db = _dims(a), _dims(b)
    lead = tuple(int(x) for x in np.broadcast_shapes(tuple(da[:2]), tuple(db[:2])))
    a3, b3 = (bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(x, (*lead, *d[2:]))),
                                       (math.prod(lead), *d[2:])))
              for x, d in ((a, da), (b, db)))
    return bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(a3, b3)),
                                    (*lead, da[2], db[3])))


def _attend(bb: relax.BlockBuilder, p: Mapping[str, Param], dtype: str,
            args: Sequence[relax.Var]) -> relax.Expr:
    q, k, v, *mask = args
    views = p["form"] == "torch"
    if p["kv"] == "repeat":
        k, v = (_repeat_kv(bb, x, int(p["H"])) for x in (k, v))
    rank = len(_dims(q))
    kt = bb.emit(relax.op.permute_dims(k, [*range(rank - 2), rank - 1, rank - 2]))
    scores = _matmul(bb, q, kt, views)
    if p["scale"] != "none":
        op = relax.op.multiply if p["scale"] == "multiply" else relax.op.divide
        scores = bb.emit(op(scores, relax.const(float(p["const"]), dtype)))
    if mask:
        scores = bb.emit(relax.op.add(scores, mask[0]))
    out = _matmul(bb, bb.emit(relax.op.nn.softmax(scores, axis=-1)), v, views)
    if not views:
        return out
    b, h, sq, hd = _dims(out)  # HF: out.transpose(1, 2).reshape(b, sq, h * d)
    return relax.op.reshape(bb.emit(relax.op.permute_dims(out, [0, 2, 1, 3])), (b, sq, h * hd))


def module(case: Case) -> tvm.IRModule:
    """The case's attention as a Relax function ``main(q, k, v[, mask])``."""
    args = [relax.Var(name, relax.TensorType(shape, case.dtype))
            for name, shape in shapes(case.params).items()]
    bb = relax.BlockBuilder()
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(_attend(bb, case.params, case.dtype, args))
        bb.emit_func_output(out)
    return bb.get()


# -- running, the reference, the pass's decision -------------------------------------------------
def run(ex, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Call the compiled model (what ``tvm_roller.relax.compile`` returns) on ``arrays``."""
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](*[tvm.runtime.tensor(np.require(a, requirements="C"), dev)
                       for a in arrays])
    return out.numpy()


def reference(case: Case, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The attention in float64 numpy on ``arrays`` cast to float64 (K and V repeated over
    the query heads; the output in the model's layout)."""
    p = case.params
    b, h, kvh, hd, sq, sk = _ints(p, "B", "H", "KVH", "D", "SQ", "SK")
    q, k, v = (a.astype(np.float64).reshape(b, -1, a.shape[-2], hd) for a in arrays[:3])
    k, v = (np.repeat(x, h // kvh, axis=1) for x in (k, v))
    s = q @ k.swapaxes(-1, -2)
    if p["scale"] == "multiply":
        s = s * float(p["const"])
    elif p["scale"] == "divide":
        s = s / float(p["const"])
    if len(arrays) > 3:
        s = s + arrays[3].astype(np.float64).reshape(families.attention_mask_shape(p))
    e = np.exp(s - s.max(-1, keepdims=True))
    out = (e / e.sum(-1, keepdims=True)) @ v
    if p["form"] == "torch":
        return out.transpose(0, 2, 1, 3).reshape(b, sq, h * hd)
    return out.reshape(shapes(p)["q"])


def route(chains: Sequence[Mapping[str, Any]], report: Sequence[Mapping[str, Any]]
          ) -> Dict[str, Any]:
    """The result's facts on how the model was built: ``attention`` (the flash-attention
    pass's reason: ``FLASH``, why it declined, or ``NOT_MATCHED``), and the kernels."""
    found = [c for c in chains if str(c.get("chain", "")).startswith("attention ")]
    return {"attention": str(found[0]["reason"]) if found else NOT_MATCHED,
            "flash_kernels": sum(e.get("kind") == "flash-attention" for e in report),
            "roller_kernels": sum(e.get("status") == "roller" for e in report),
            "fallbacks": sum(e.get("status") == "fallback" for e in report)}


def check_report(report: Sequence[Mapping[str, Any]]) -> None:
    """:class:`KernelFellBack` when roller failed on any function of the model."""
    failed = [f"{e['name']}: {e['reason']}" for e in report if e.get("fallback") == "error"]
    if failed:
        raise KernelFellBack(f"roller failed on {len(failed)} function(s): {'; '.join(failed)}")
