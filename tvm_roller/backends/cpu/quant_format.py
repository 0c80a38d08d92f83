"""Weights quantized in groups of 32 along K, packed the way roller's integer kernels read them
(``quant_linear``). numpy only: the packing runs once, at load.

Both formats keep one float32 scale ``d`` per (row, group) and store an unsigned code ``u`` with
an offset, ``w ≈ (u - offset) · d``:

* ``int8``: ``q = round(w / d)`` in [-127, 127], ``d = max|w| / 127``; ``u = q + 128`` (one byte).
* ``int4``: ``d = w_max / -8`` (``w_max`` the group's weight of largest magnitude, sign kept, so
  it maps to -8 exactly and all 16 codes are used, as llama.cpp's q4_0), ``q`` in [-8, 7];
  ``u = q + 8`` (a nibble).

Unsigned codes, because the dot-product instruction (``vpdpbusd``) multiplies unsigned bytes by
signed ones: the activations are the signed side, and the offset comes back as
``offset · Σ x_q`` per group, which depends on the activations alone.

Layout: ``words[N/16, K/32, chunks, 16]`` int32 — 16 consecutive rows side by side (a vector's
16 lanes are 16 output rows), each lane's word four of its row's codes along K: int8 chunk ``c``
holds ``k = 4c .. 4c+3`` of the group; int4 chunk ``c`` holds ``k = 8c .. 8c+3`` in its bytes' low
nibbles and ``k = 8c+4 .. 8c+7`` in the high ones (one AND, or a shift and an AND, unpacks four
bytes per lane). ``scales[N/16, K/32, 16]`` float32, in the same row order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

GROUP = 32  # weights per scale, along K (llama.cpp's q8_0 / q4_0 blocks)
ROWS = 16   # output rows side by side: one AVX-512 vector of int32 lanes


@dataclass(frozen=True)
class QuantFormat:
    """A weight-only format: ``bits`` per weight in groups of ``GROUP`` with a float32 scale."""

    name: str
    bits: int

    @property
    def offset(self) -> int:
        return 1 << (self.bits - 1)

    @property
    def chunks(self) -> int:
        """int32 words per row per group."""
        return GROUP * self.bits // 32

    def bytes_per_weight(self) -> float:
        """Bytes read per weight, the scale included (int8: 1.125, int4: 0.625)."""
        return self.bits / 8 + 4 / GROUP


FORMATS = {"int8": QuantFormat("int8", 8), "int4": QuantFormat("int4", 4)}


def get_format(name: str) -> QuantFormat:
    if name not in FORMATS:
        raise ValueError(f"weights={name!r}: expected one of 'fp32', {', '.join(map(repr, FORMATS))}")
    return FORMATS[name]


def shape_reason(fmt: QuantFormat, n: int, k: int) -> Optional[str]:
    """Why a [n, k] weight cannot take ``fmt`` (None: it can)."""
    if n % ROWS or k % GROUP:
        return (f"{fmt.name} weights need rows in multiples of {ROWS} and K in multiples of "
                f"{GROUP}; this weight is [{n}, {k}]")
    return None


def quantize(fmt: QuantFormat, w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(codes[n, k] uint8, scales[n, k / 32] float32)`` of ``w`` [n, k] (row-major, unpacked)."""
    n, k = w.shape
    groups = w.astype(np.float32).reshape(n, k // GROUP, GROUP)
    if fmt.bits == 8:
        d = np.abs(groups).max(axis=-1) / 127.0
        lo, hi = -127, 127
    else:
        pick = np.abs(groups).argmax(axis=-1)[..., None]
        d = np.take_along_axis(groups, pick, axis=-1)[..., 0] / -8.0
        lo, hi = -8, 7
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.rint(groups * inv[..., None]), lo, hi).astype(np.int32)
    return (q + fmt.offset).astype(np.uint8).reshape(n, k), d.astype(np.float32)


def dequantize(fmt: QuantFormat, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The float64 weights ``(u - offset) · d`` the codes stand for."""
    n, k = codes.shape
    q = codes.astype(np.float64).reshape(n, k // GROUP, GROUP) - fmt.offset
    return (q * scales.astype(np.float64)[..., None]).reshape(n, k)


def pack(fmt: QuantFormat, codes: np.ndarray, scales: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(words, scales)`` in the kernel's layout (see the module's docstring)."""
    n, k = codes.shape
    g = k // GROUP
    if fmt.bits == 8:
        by = codes.reshape(n // ROWS, ROWS, g, fmt.chunks, 4)
    else:
        nib = codes.reshape(n, g, fmt.chunks, 2, 4)
        by = (nib[:, :, :, 0, :] | (nib[:, :, :, 1, :] << 4)).astype(np.uint8)
        by = by.reshape(n // ROWS, ROWS, g, fmt.chunks, 4)
    words = np.ascontiguousarray(by.transpose(0, 2, 3, 1, 4)).view("<i4")[..., 0]
    sc = np.ascontiguousarray(scales.reshape(n // ROWS, ROWS, g).transpose(0, 2, 1))
    return words, sc


def quantize_packed(fmt: QuantFormat, w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``pack(fmt, *quantize(fmt, w))`` of a ``[n, k]`` weight; a stack ``[..., n, k]`` (a
    mixture's experts) packed matrix by matrix, the results stacked along the same axes."""
    if w.ndim == 2:
        return pack(fmt, *quantize(fmt, w))
    each = [quantize_packed(fmt, m) for m in w.reshape(-1, *w.shape[-2:])]
    lead = w.shape[:-2]
    return tuple(np.stack([e[i] for e in each]).reshape(*lead, *each[0][i].shape)
                 for i in range(2))
