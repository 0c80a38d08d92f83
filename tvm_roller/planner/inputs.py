"""Arguments to run a function on: random inputs, NaN-filled outputs.

Float inputs are uniform in [-1, 1) and never zero (a zero hides a kernel that reads the wrong
place); integer inputs are zero (they may index another tensor: any other value could read out
of bounds); outputs start as NaN, so an element a kernel never writes shows.
"""
from __future__ import annotations

from typing import List, Optional, Set

import numpy as np
from tvm import tirx

from tvm_roller.analysis.visit import post_order_visit


def output_params(func: tirx.PrimFunc) -> Set[int]:
    """Indices of the parameters the function writes."""
    written: List[int] = []
    post_order_visit(func.body, lambda n: written.append(n.buffer.id_)
                     if isinstance(n, tirx.BufferStore) else None)
    ids = set(written)
    return {i for i, p in enumerate(func.params) if p.id_ in ids}


def random_arguments(func: tirx.PrimFunc, seed: int = 0) -> List[Optional[np.ndarray]]:
    """One array per buffer parameter (None for a scalar one)."""
    outputs = output_params(func)
    rng = np.random.default_rng(seed)
    return [_array(p, i in outputs, rng) for i, p in enumerate(func.params)]


def _array(param, is_output: bool, rng) -> Optional[np.ndarray]:
    shape = getattr(getattr(param, "ty", None), "shape", None)
    if shape is None:
        return None
    dims = [int(d) for d in shape]
    dtype = str(param.dtype)
    if is_output:
        return np.full(dims, np.nan, dtype) if "float" in dtype else np.zeros(dims, dtype)
    if "float" in dtype:
        x = rng.uniform(-1.0, 1.0, size=dims)
        x[x == 0] = 0.5
        return x.astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=dims).astype(bool)
    return np.zeros(dims, dtype)
