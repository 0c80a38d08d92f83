"""Workloads of the public single-op suite ``tvm.s_tir.meta_schedule.testing.te_workload.CONFIGS``.

13 operator classes x 4 shapes = 52 workloads. ``C2D_WIN_NHWC`` is left out: it cannot be
created in TVM 0.27.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import tvm

# Order follows the MetaSchedule / ROLLER papers' tables.
CLASSES: Tuple[str, ...] = (
    "C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG",
)
NUM_SHAPES = 4
# Classes whose arithmetic intensity is too low to be judged in GFLOP/s: report GB/s instead.
MEMORY_BOUND = frozenset({"SFM", "NRM", "DEP"})
# Present in CONFIGS but not creatable in TVM 0.27 (topi winograd import fails).
EXCLUDED = {"C2D_WIN_NHWC": "cannot be created in TVM 0.27"}

Workload = Tuple[str, int]


def workload_name(cls: str, idx: int) -> str:
    """``("GMM", 1) -> "GMM:1"`` (the key used in tables and JSON)."""
    return f"{cls}:{idx}"


def _valid_help() -> str:
    return (
        f"valid classes: {', '.join(CLASSES)}; give CLASS or CLASS:INDEX with INDEX in "
        f"0..{NUM_SHAPES - 1}, comma separated (e.g. 'GMM,C2D:1')"
    )


def parse_workload(spec: str) -> List[Workload]:
    """One spec item: ``"GMM"`` -> all four shapes, ``"GMM:1"`` -> one."""
    item = spec.strip()
    if not item:
        raise ValueError(f"empty workload spec; {_valid_help()}")
    cls, sep, idx_s = item.partition(":")
    cls = cls.strip().upper()
    if cls in EXCLUDED:
        raise ValueError(f"workload class {cls!r} is excluded ({EXCLUDED[cls]}); {_valid_help()}")
    if cls not in CLASSES:
        raise ValueError(f"unknown workload class {cls!r}; {_valid_help()}")
    if not sep:
        return [(cls, i) for i in range(NUM_SHAPES)]
    try:
        idx = int(idx_s.strip())
    except ValueError:
        raise ValueError(f"bad shape index {idx_s!r} in {item!r}; {_valid_help()}") from None
    if not 0 <= idx < NUM_SHAPES:
        raise ValueError(f"shape index {idx} out of range in {item!r}; {_valid_help()}")
    return [(cls, idx)]


def list_workloads(ops: Optional[str | Sequence[str]] = None) -> List[Workload]:
    """Parse ``"GMM,C2D:1"`` (or a list of such items) into ``[(cls, idx), ...]``.

    ``None`` or ``""`` means the whole suite. Duplicates are dropped, first occurrence kept.
    Raises ValueError naming the valid classes on a bad item.
    """
    if ops is None or (isinstance(ops, str) and not ops.strip()):
        return [(c, i) for c in CLASSES for i in range(NUM_SHAPES)]
    items = ops.split(",") if isinstance(ops, str) else [p for s in ops for p in s.split(",")]
    out: List[Workload] = []
    for item in items:
        for wl in parse_workload(item):
            if wl not in out:
                out.append(wl)
    return out


def params(cls: str, idx: int) -> tuple:
    """The positional arguments CONFIGS gives the te_workload function."""
    from tvm.s_tir.meta_schedule.testing import te_workload

    return tuple(te_workload.CONFIGS[cls][1][idx])


def create(cls: str, idx: int) -> "tvm.tirx.PrimFunc":
    """The workload's PrimFunc, exactly as the shared MetaSchedule baselines were tuned on
    (structural equality is what the tuning database keys on)."""
    from tvm.s_tir.meta_schedule.testing import te_workload

    parse_workload(workload_name(cls, idx))  # validate with the helpful message
    return te_workload.create_te_workload(cls, idx).with_attr("global_symbol", "main")


def arg_specs(func: "tvm.tirx.PrimFunc") -> List[Tuple[Tuple[int, ...], str]]:
    """``[(shape, dtype), ...]`` for every parameter; the last one is the output."""
    # PrimFunc.buffer_map is not exposed to Python in 0.27; ArgInfo reads it for us.
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in ArgInfo.from_prim_func(func)]


def flop_count(func: "tvm.tirx.PrimFunc") -> float:
    """TVM's own FLOP estimate (``estimate_tir_flops``), so numbers match MetaSchedule's."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    return float(estimate_tir_flops(tvm.IRModule({"main": func})))


def bytes_moved(func: "tvm.tirx.PrimFunc") -> int:
    """Compulsory traffic: every argument read or written once (for GB/s)."""
    import numpy as np

    return int(sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in arg_specs(func)))


def is_memory_bound(cls: str) -> bool:
    return cls in MEMORY_BOUND


def random_inputs(func: "tvm.tirx.PrimFunc", seed: int = 0) -> List["np.ndarray"]:
    """Uniform(-1, 1) inputs for every parameter but the output; never zero (a zero input
    would hide indexing bugs such as reading the padding instead of the data)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in arg_specs(func)[:-1]:
        x = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        x[x == 0] = 0.5
        out.append(x)
    return out


def output_spec(func: "tvm.tirx.PrimFunc") -> Tuple[Tuple[int, ...], str]:
    return arg_specs(func)[-1]
