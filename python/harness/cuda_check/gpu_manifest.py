"""The bundle directory both halves of the device check share (``gpu_check``): its manifest's
name and format, the target arch, the implementations an entry holds, reading its gzip files
and picking entries by name.

The GPU machine imports this (``gpu_launch``, ``gpu_measure``) without TVM: nothing here may
import TVM or the rest of tvm_roller.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

MANIFEST = "manifest.json"
FORMAT = 1
ARCH = "sm_90"
# the implementations of a manifest entry (its "impls"; the first is roller's, the one compared):
# the suite and the fp16 GEMMs against TVM's dlight; a chain as roller builds it (fused when the
# model says it pays) against roller's own kernels for its operators one by one
SUITE_IMPLS = ("roller", "dlight")
CHAIN_IMPLS = ("roller", "unfused")


def read_gz(path: Path) -> bytes:
    with gzip.open(path, "rb") as fh:
        return fh.read()


def load_manifest(d: Path) -> Dict[str, Any]:
    m = json.loads((Path(d) / MANIFEST).read_text())
    if m.get("format") != FORMAT:
        raise SystemExit(f"{d}/{MANIFEST} is format {m.get('format')}, expected {FORMAT}")
    return m


def impls_of(wl: Dict[str, Any]) -> List[str]:
    """The implementations a manifest entry (or result row) holds, roller's first."""
    return list(wl.get("impls") or SUITE_IMPLS)  # manifests before chains: roller and dlight


def select(workloads: List[Dict[str, Any]], ops: Optional[str]) -> List[Dict[str, Any]]:
    """Manifest entries named by ``ops`` ("GMM,SFM:0,HGEMM:1024,CHAIN:mlp"; a class names all
    its shapes)."""
    if not ops:
        return workloads
    items = [s.strip().upper() for s in ops.split(",") if s.strip()]
    return [w for w in workloads
            if any(w["name"].upper() == i or w["name"].upper().split(":")[0] == i for i in items)]
