"""The input of the Chimera data-movement model (``tvm_roller.fusion.movement``): a chain of
compute-intensive ops described by its :class:`Loop` s, the :class:`TensorUse` s (which loops index
each tensor, its element size and role) and the :class:`Op` s. Plain Python: no TVM."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Tuple

DTYPE_OF_BYTES = {1: "int8", 2: "float16", 4: "float32", 8: "float64"}


@dataclass
class Loop:
    """One loop of the chain. ``untiled`` loops (a convolution window) always take their full
    extent as the tile size."""

    name: str
    extent: int
    untiled: bool = False


@dataclass
class TensorUse:
    """A tensor: the loops indexing it, its element size and role ("input", "output" or
    "intermediate": produced by one op and consumed by the next, on chip when fused)."""

    name: str
    loops: Tuple[str, ...]
    elem_bytes: int
    role: str
    dtype: str = ""  # optional, only for messages ("float32"); derived from elem_bytes if empty

    @property
    def dtype_name(self) -> str:
        return self.dtype or DTYPE_OF_BYTES.get(self.elem_bytes, f"{self.elem_bytes}-byte")


@dataclass
class Op:
    """One compute-intensive op: every loop it iterates (spatial and reduction), which of them
    it reduces over, and the tensors it touches."""

    name: str
    loops: Tuple[str, ...]
    reduction: Tuple[str, ...]
    tensors: Tuple[str, ...]


@dataclass
class Chain:
    """A chain of ops: its loops, tensors and ops (``validate`` checks that they agree)."""

    loops: List[Loop]
    tensors: List[TensorUse]
    ops: List[Op]
    name: str = ""

    # -- lookups -------------------------------------------------------------------------------
    def extents(self) -> Dict[str, int]:
        return {lp.name: int(lp.extent) for lp in self.loops}

    def loop(self, name: str) -> Loop:
        for lp in self.loops:
            if lp.name == name:
                return lp
        raise KeyError(name)

    def tensor(self, name: str) -> TensorUse:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def intermediates(self) -> List[TensorUse]:
        return [t for t in self.tensors if t.role == "intermediate"]

    def tensor_bytes(self, name: str) -> int:
        t, ext = self.tensor(name), self.extents()
        return t.elem_bytes * math.prod(ext[d] for d in t.loops)

    def op_flops(self, op: Op) -> float:
        ext = self.extents()
        return 2.0 * math.prod(ext[d] for d in op.loops)

    def flops(self) -> float:
        return sum(self.op_flops(o) for o in self.ops)

    def validate(self) -> None:
        """Raise ValueError on an inconsistent description."""
        names = [lp.name for lp in self.loops]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate loop names in {names}")
        for lp in self.loops:
            if int(lp.extent) < 1:
                raise ValueError(f"loop {lp.name} has extent {lp.extent}")
        tnames = [t.name for t in self.tensors]
        if len(set(tnames)) != len(tnames):
            raise ValueError(f"duplicate tensor names in {tnames}")
        for t in self.tensors:
            if t.role not in ("input", "output", "intermediate"):
                raise ValueError(f"tensor {t.name}: role {t.role!r} is not input, output or "
                                 "intermediate")
            if t.elem_bytes < 1:
                raise ValueError(f"tensor {t.name}: elem_bytes {t.elem_bytes}")
            for d in t.loops:
                if d not in names:
                    raise ValueError(f"tensor {t.name} is indexed by unknown loop {d!r}")
        if not self.ops:
            raise ValueError("a chain needs at least one op")
        for o in self.ops:
            for d in o.loops:
                if d not in names:
                    raise ValueError(f"op {o.name} iterates unknown loop {d!r}")
            for d in o.reduction:
                if d not in o.loops:
                    raise ValueError(f"op {o.name}: reduction loop {d!r} is not one of its loops")
            for tn in o.tensors:
                if tn not in tnames:
                    raise ValueError(f"op {o.name} touches unknown tensor {tn!r}")
                missing = set(self.tensor(tn).loops) - set(o.loops)
                if missing:
                    raise ValueError(f"tensor {tn} is indexed by {sorted(missing)}, which op "
                                     f"{o.name} does not iterate")
        for t in self.intermediates():
            users = [o.name for o in self.ops if t.name in o.tensors]
            if len(users) < 2:
                raise ValueError(f"intermediate {t.name} must be touched by two ops, not {users}")

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "loops": [asdict(lp) for lp in self.loops],
            "tensors": [{**asdict(t), "loops": list(t.loops)} for t in self.tensors],
            "ops": [{"name": o.name, "loops": list(o.loops), "reduction": list(o.reduction),
                     "tensors": list(o.tensors)} for o in self.ops],
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Chain":
        return cls(
            loops=[Loop(**lp) for lp in d["loops"]],
            tensors=[TensorUse(**{**t, "loops": tuple(t["loops"])}) for t in d["tensors"]],
            ops=[Op(o["name"], tuple(o["loops"]), tuple(o["reduction"]), tuple(o["tensors"]))
                 for o in d["ops"]],
            name=d.get("name", ""),
        )
