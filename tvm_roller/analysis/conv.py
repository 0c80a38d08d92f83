"""Reuse facts of a main block that the convolution policy needs, read off its accesses.

A *sliding window* is an input dimension indexed by a spatial and a reduction axis together
(``y * s + ry``, also the ``ff + rc`` of a depthwise convolution): neighbouring outputs share
inputs. A *convolution* here is any block that reads a windowed input and a second tensor
(the filter) — classified by its access pattern, never by the block's or the operator's name.
"""
from __future__ import annotations

from typing import List, Tuple

from tvm_roller.analysis.func import FuncAnalysis


def window_pairs(fa: FuncAnalysis) -> List[Tuple[int, int]]:
    """(spatial, reduction) axis pairs that move one input dimension together."""
    pairs = []
    for acc in fa.reads:
        for d in acc.dims:
            if d.coeffs is None:
                continue
            sp = [i for i, c in enumerate(d.coeffs) if c and fa.axes[i].kind == "S"]
            rd = [i for i, c in enumerate(d.coeffs) if c and fa.axes[i].kind == "R"]
            pairs += [(s, r) for s in sp for r in rd if (s, r) not in pairs]
    return pairs


def is_convolution(fa: FuncAnalysis) -> bool:
    """A windowed input plus a second input: a convolution (1-D, 2-D, strided, dilated,
    grouped, depthwise, patchify), whatever its operator or block is called."""
    return bool(window_pairs(fa)) and len({acc.buffer for acc in fa.reads}) >= 2 and \
        fa.vector_axis is not None
