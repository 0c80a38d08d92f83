"""Cache keys: what decides what roller builds, as canonical JSON and its sha256.

* ``func``: ``tvm_ffi.structural_hash`` of the PrimFunc with its ``global_symbol`` attribute
  removed, plus the parameters' dtypes and shapes. The name is dropped on purpose: Relax's FuseTIR
  names identical layers ``fused_matmul_add``, ``fused_matmul_add1``, ... and they should share one
  entry. Other attributes (``tirx.noalias``, ...) change the lowering, so they stay in the hash.
  The structural hash already ignores buffer, variable and block names.
* ``target``: the normalised target as sorted JSON (normalising is the caller's: the keys take
  the ``Target`` the planner's context made).
* ``device``: ``DeviceModel.to_json()`` without ``source`` (where the numbers came from is not a
  number the policy reads): a recalibration or another preset changes the key.
* ``roller``: ``tvm_roller.__version__`` plus a digest of the source folders that decide the
  result (an editable install keeps its version while the policy changes), and the TVM /
  tvm-ffi versions.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Protocol, Tuple

import tvm
import tvm_ffi

from tvm_roller.core.ffi import plain
from tvm_roller.core.inputs import unwrap_func

# Attributes that only name a function; dropped before hashing (see the module doc).
_NAME_ATTRS = ("global_symbol",)
# The source folders whose code decides the tiles: every layer up to the planner (whole
# folders, so no file is forgotten). Target and device normalisation results are in the key
# themselves.
TILE_CODE = ("core", "hardware", "analysis", "fusion", "backends", "planner")


class JsonModel(Protocol):
    """A device model as the keys read it (``hardware.DeviceModel``)."""

    def to_json(self) -> str: ...


def canonical(obj: Any) -> str:
    """The one JSON spelling of ``obj`` (sorted keys, no spaces) that keys are hashed from."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def material_digest(material: Dict[str, Any]) -> str:
    """The hex sha256 of key material (canonical JSON)."""
    return sha256(canonical(material))


@functools.lru_cache(maxsize=None)
def roller_code_digest(parts: Tuple[str, ...] = TILE_CODE) -> str:
    """sha256 over the source of ``parts`` of the package (files or directories; "." is all of
    it), once per process (~1 ms): an editable install keeps ``__version__`` while its policy or
    lowering changes, and must not keep serving the old tiles."""
    root = Path(__file__).resolve().parents[1]
    files = []
    for rel in parts:
        p = root / rel
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        if path.is_file():  # absent in this install: its name alone enters the digest
            h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def context_material(tgt: tvm.target.Target, device: JsonModel,
                     code: Tuple[str, ...] = TILE_CODE) -> Dict[str, Any]:
    """Everything besides the function itself that decides what roller builds: the normalised
    target, the device constants, roller's version and code (``code``: which parts), and TVM's
    version. Shared by the schedule cache and the compiled-module cache."""
    from tvm_roller.core import version  # the attribute, read now (tests monkeypatch it)

    device_json = json.loads(device.to_json())
    device_json.pop("source", None)  # provenance only; the numbers are what matter
    return {
        "target": plain(tgt.export()),
        "device": device_json,
        "roller": {"version": version.__version__, "code": roller_code_digest(code)},
        "tvm": {"tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__},
    }


def func_fingerprint(func) -> Dict[str, Any]:
    """The function part of the key material: structural hash (name attributes removed) and the
    parameters' dtypes/shapes (a cheap second discriminator next to a 64-bit hash)."""
    f = unwrap_func(func)
    attrs = f.attrs
    for name in _NAME_ATTRS:
        if attrs is not None and name in attrs:
            f = f.without_attr(name)
    params = []
    for p in f.params:
        # in 0.27 a buffer parameter is a Var with a BufferType (shape + dtype); scalars have none
        shape = getattr(getattr(p, "ty", None), "shape", None)
        params.append([str(p.ty.dtype), None if shape is None else [str(d) for d in shape]])
    return {"hash": f"{tvm_ffi.structural_hash(f):016x}", "params": params}
