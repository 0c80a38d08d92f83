"""The device check's results as tables (``gpu_check``'s run half): the suite and fp16 GEMMs
(roller vs dlight vs PyTorch), the GEMM chains (roller vs unfused vs PyTorch, with the model's
fusion decision) and the measured device constants, as plain text and markdown, with the
geomean speed-ups in a summary.

Nothing here may import TVM or the rest of tvm_roller: the GPU machine has neither.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from harness.cuda_check.gpu_manifest import impls_of


def fmt_us(v: Optional[float]) -> str:
    """A time in microseconds as the tables and the log show it ("-" when there is none)."""
    return "-" if v is None else (f"{v:.1f}" if v < 1000 else f"{v:.0f}")


def _speedup(row: Dict[str, Any], other: str, base: str = "roller") -> Optional[float]:
    """``other``'s time / ``base``'s time when both are correct (> 1: ``base`` is faster)."""
    r, o = row.get(base, {}), row.get(other, {})
    if r.get("status") == "ok" and o.get("status") == "ok" and r.get("us") and o.get("us"):
        return o["us"] / r["us"]
    return None


def _geomean(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def status_text(res: Dict[str, Any]) -> str:
    """An implementation's outcome as a table cell ("ok", "ERR 1.2e-03", "declined", ...)."""
    s = res.get("status", "-")
    if s == "ok":
        return "ok"
    if s == "wrong":
        return f"ERR {res['rel_err']:.1e}"
    return {"declined": "declined", "build-error": "build-err", "run-error": "run-err",
            "skipped": "skipped"}.get(s, s)


def _grid(head: List[str], body: List[List[Any]]) -> Tuple[List[str], List[str]]:
    """(plain-text lines, markdown lines) of a table: the first column left-aligned."""
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    text = [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(str(c) for c in b) + " |" for b in body]
    return text, md


def _fmt_x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


# column titles of a chain's speed-ups (peer time / roller time); other peers get "vs <name>"
CHAIN_LABELS = {"unfused": "fused vs unfused", "torch": "x torch"}


def chain_table(rows: List[Dict[str, Any]]) -> Tuple[List[str], List[str], Dict[str, Any]]:
    """(text lines, markdown lines, summary) of GEMM-chain rows: each implementation of the row
    (``impls``, roller's first) and PyTorch, with the model's decision ("model": fused or not)
    and roller's speed-up over each of the others. Where the model declined to fuse, roller's
    kernels are the unfused ones: "fused vs unfused" is then about 1 by construction, so its
    geomean counts the chains the model fused only."""
    impls = impls_of(rows[0])
    base, peers = impls[0], impls[1:] + ["torch"]
    if any(impls_of(r) != impls for r in rows):
        raise ValueError(f"chain rows with different implementations: {[impls_of(r) for r in rows]}")
    labels = [CHAIN_LABELS.get(q, f"vs {q}") for q in peers]
    head = (["chain", "model"] + impls + ["torch"] + [f"{i} us" for i in impls + ["torch"]]
            + labels)
    fused = lambda r: bool(r.get("fusion", {}).get("fuse"))
    body = []
    for r in rows:
        model = ("fused" if fused(r) else "unfused") if "fusion" in r else "-"
        mark = lambda res: status_text(res) + ("*" if res.get("built_under") else "")
        body.append([r["name"], model] + [mark(r.get(i, {})) for i in impls + ["torch"]]
                    + [fmt_us(r.get(i, {}).get("us")) for i in impls + ["torch"]]
                    + [_fmt_x(_speedup(r, q, base)) for q in peers])
    summary: Dict[str, Any] = {
        "chains": len(rows), "fused": [r["name"] for r in rows if fused(r)],
        f"{base}_ok": sum(r.get(base, {}).get("status") == "ok" for r in rows),
        f"{base}_wrong": [r["name"] for r in rows if r.get(base, {}).get("status") == "wrong"]}
    gm = ["geomean", ""] + [""] * 2 * (len(impls) + 1)
    for q, label in zip(peers, labels):
        among = [r for r in rows if fused(r)] if q in impls else rows
        key = "geomean_" + label.replace(" ", "_")
        summary[key] = _geomean([_speedup(r, q, base) for r in among])
        summary["n_" + label.replace(" ", "_")] = sum(_speedup(r, q, base) is not None
                                                      for r in among)
        gm.append(_fmt_x(summary[key]))
        if q != "torch":
            summary[f"{q}_ok"] = sum(r.get(q, {}).get("status") == "ok" for r in rows)
    text, md = _grid(head, body + [gm])
    note = (f'"{labels[0]}" = {peers[0]} us / {base} us (> 1: {base} is faster); its geomean '
            f"over the chains the model fused only ({base} = {peers[0]} elsewhere)")
    notes = [note]
    if any(r.get(i, {}).get("built_under") for r in rows for i in impls):
        notes.append("* built under TVM's default PassContext: roller's (cp.async) failed to "
                     "lower it (the manifest has the error)")
    summary["built_under_default_context"] = [f"{r['name']}/{i}" for r in rows for i in impls
                                              if r.get(i, {}).get("built_under")]
    return (["GEMM chains"] + text + notes, ["", "GEMM chains", ""] + md + [""] + notes,
            summary)


def table(rows: List[Dict[str, Any]], micro: List[Dict[str, Any]]) -> Tuple[str, str, Dict[str, Any]]:
    """(plain text, markdown, summary) of the results: the suite and fp16 GEMMs (roller vs
    dlight vs torch), then the GEMM chains (``chain_table``; summary["chains"])."""
    chains = [r for r in rows if r.get("kind") == "chain"]
    rows = [r for r in rows if r.get("kind") != "chain"]
    head = ["workload", "roller", "dlight", "torch", "roller us", "dlight us", "torch us",
            "vs dlight", "vs torch"]
    body = []
    for r in rows:
        sd, st = _speedup(r, "dlight"), _speedup(r, "torch")
        body.append([r["name"], status_text(r.get("roller", {})), status_text(r.get("dlight", {})),
                     status_text(r.get("torch", {})), fmt_us(r.get("roller", {}).get("us")),
                     fmt_us(r.get("dlight", {}).get("us")), fmt_us(r.get("torch", {}).get("us")),
                     _fmt_x(sd), _fmt_x(st)])
    summary = {
        "geomean_vs_dlight": _geomean([_speedup(r, "dlight") for r in rows]),
        "geomean_vs_torch": _geomean([_speedup(r, "torch") for r in rows]),
        "n_vs_dlight": sum(_speedup(r, "dlight") is not None for r in rows),
        "n_vs_torch": sum(_speedup(r, "torch") is not None for r in rows),
        "roller_ok": sum(r.get("roller", {}).get("status") == "ok" for r in rows),
        "roller_wrong": [r["name"] for r in rows if r.get("roller", {}).get("status") == "wrong"],
        "dlight_ok": sum(r.get("dlight", {}).get("status") == "ok" for r in rows),
        "workloads": len(rows),
    }
    gm = ["geomean", "", "", "", "", "", "", _fmt_x(summary["geomean_vs_dlight"]),
          _fmt_x(summary["geomean_vs_torch"])]
    text, md = _grid(head, body + [gm]) if rows or not chains else ([], [])
    if chains:
        ctext, cmd, summary["chains"] = chain_table(chains)
        text += ([""] if text else []) + ctext
        md += cmd if md else cmd[3:]
    mtext, mmd = [], []
    if micro:
        mtext.append("device constants (measured vs preset h200)")
        mmd += ["", "| constant | measured | preset | measured/preset | how |", "|---|---|---|---|---|"]
        for m in micro:
            if "error" in m:
                mtext.append(f"  {m['name']:<24s} error: {m['error']}")
                mmd.append(f"| {m['name']} | error | | | {m['error']} |")
                continue
            ratio = "-" if m["ratio"] is None else f"{m['ratio']:.2f}"
            pre = "-" if m["preset"] is None else f"{m['preset']:.0f}"
            mtext.append(f"  {m['name']:<24s} {m['measured']:>10.0f} {m['unit']:<8s} "
                         f"preset {pre:>8s}  ratio {ratio}  ({m['how']})")
            mmd.append(f"| {m['name']} ({m['unit']}) | {m['measured']:.0f} | {pre} | {ratio} "
                       f"| {m['how']} |")
    return "\n".join(mtext + [""] + text), "\n".join(md + mmd), summary
