"""A linear layer over group-quantized weights (``quant_format``) in integer dot products:
``y[m, n] = Σ_g sw[n, g] · sx[m, g] · Σ_{k in g} x_q[m, k] · (u[n, k] − offset)``.

Two kernels:

* ``quantize_rows``: each activation row in groups of 32 → int8 codes ``x_q`` (scale
  ``sx = max|x| / 127``), ``sx`` and ``offset · Σ x_q`` per group (the unsigned weight codes'
  offset, taken back once per group instead of once per weight);
* ``matmul``: a task is 16 output rows (one int32 lane each); per group it loads their packed
  codes once (int4: 4 vectors, unpacked by an AND and a shift + AND into 8; int8: 8 vectors),
  then for each of ``ROW_TILE`` activation rows runs 8 ``vpdpbusd`` (64 products each: 4 per
  lane, unsigned weight bytes × signed activation bytes broadcast) in two independent chains,
  and one float step: ``acc += float(dot − correction) · (sw · sx)``.

The weights are read at their packed size (int4: 0.625 bytes a weight with its scale) and
decoded in registers; the products are exact in int32, the groups' sums in float32. Per 512
weights this is 8 dot products and ~12 unpacking operations against 64 ``vfmadd`` and ~96
conversions for a float32 dequantization — why the activations are quantized (as llama.cpp's
q8_0 activations for its q4_0 / q8_0 weights).

One task's unpacked group (8 vectors) is reused across ``ROW_TILE`` activation rows (a prefill's
GEMM), whose float accumulators stay in registers: 8 + ``ROW_TILE`` vector registers.
"""
from __future__ import annotations

import tvm
from tvm import tirx
from tvm.script import tirx as T

from tvm_roller.backends.cpu.quant_format import GROUP, ROWS, QuantFormat

ROW_TILE = 8  # activation rows per pass over a group's unpacked weights
AHEAD_BYTES = 8192  # how far ahead the weights are prefetched (measured: 4-16 KiB alike)
WORDS = GROUP // 4  # int32 words of int8 activations per group
_VNNI = "llvm.x86.avx512.vpdpbusd.512"


def has_int8_dot(target: tvm.target.Target) -> bool:
    """Whether ``target`` has the AVX-512 VNNI dot product the kernel is built from."""
    from tvm.target import codegen

    return str(target.kind) == "llvm" and bool(codegen.target_has_features("avx512vnni", target))


def quantize_rows_kernel(fmt: QuantFormat, k: int) -> tirx.PrimFunc:
    """``(x[m, k] float32) -> x_q[m, k] int8, sx[m, k/32] float32, corr[m, k/32] int32``."""
    groups, offset = k // GROUP, fmt.offset

    @T.prim_func(private=True, s_tir=True)
    def quantize_rows(x_var: T.handle, q_var: T.handle, s_var: T.handle, c_var: T.handle):
        T.func_attr({"tirx.noalias": True})
        m = T.int64()
        x = T.match_buffer(x_var, (m, k), "float32")
        xq = T.match_buffer(q_var, (m, k), "int8")
        xs = T.match_buffer(s_var, (m, groups), "float32")
        xc = T.match_buffer(c_var, (m, groups), "int32")
        with T.sblock("root"):  # (Relax's reshape check wants a root block)
            for r in T.parallel(m):
                for g in range(groups):
                    amax = T.alloc_buffer((1,), "float32")
                    total = T.alloc_buffer((1,), "int32")
                    amax[0] = T.float32(0)
                    for j in range(GROUP):
                        amax[0] = T.max(amax[0], T.abs(x[r, g * GROUP + j]))
                    scale = amax[0] / T.float32(127)
                    inv = T.Select(amax[0] > T.float32(0), T.float32(127) / amax[0],
                                   T.float32(0))
                    for j in T.vectorized(GROUP):
                        xq[r, g * GROUP + j] = T.Cast("int8", T.round(x[r, g * GROUP + j] * inv))
                    total[0] = 0
                    for j in range(GROUP):
                        total[0] = total[0] + T.Cast("int32", xq[r, g * GROUP + j])
                    xs[r, g] = scale
                    xc[r, g] = total[0] * offset

    return quantize_rows


def _v(base):
    """The 16 lanes from ``base``."""
    return T.ramp(base, 1, ROWS)


def _word(xq, row, k):
    """Four int8 activation codes from ``k`` on as one int32, in every lane."""
    return T.Broadcast(T.reinterpret("int32", xq[row, T.ramp(k, 1, 4)]), ROWS)


def _dot(acc, w, x):
    """``acc + Σ_4 w_bytes(unsigned) · x_bytes(signed)`` per int32 lane."""
    # (LLVM's signature takes the bytes as <64 x i8>)
    return T.call_llvm_pure_intrin("int32x16", T.llvm_lookup_intrinsic_id(_VNNI), acc,
                                   T.reinterpret("int8x64", w), T.reinterpret("int8x64", x))


def matmul_kernel(fmt: QuantFormat, n: int, k: int) -> tirx.PrimFunc:
    """``(x_q[m, k] int8, sx[m, k/32], corr[m, k/32], words, scales) -> y[m, n] float32``
    (``m`` symbolic: a prompt's tokens)."""
    blocks, groups, chunks, nibbles = n // ROWS, k // GROUP, fmt.chunks, fmt.bits == 4
    ahead = AHEAD_BYTES // (chunks * ROWS * 4)  # in groups

    @T.prim_func(private=True, s_tir=True)
    def quant_matmul(q_var: T.handle, s_var: T.handle, c_var: T.handle,
                     words: T.Buffer((blocks, groups, chunks, ROWS), "int32"),
                     scales: T.Buffer((blocks, groups, ROWS), "float32"), y_var: T.handle):
        T.func_attr({"tirx.noalias": True})
        m = T.int64()
        xq = T.match_buffer(q_var, (m, k), "int8")
        xs = T.match_buffer(s_var, (m, groups), "float32")
        xc = T.match_buffer(c_var, (m, groups), "int32")
        y = T.match_buffer(y_var, (m, n), "float32")
        with T.sblock("root"):  # (Relax's reshape check wants a root block)
            for nb in T.parallel(blocks):
                for mt in range((m + ROW_TILE - 1) // ROW_TILE):
                    acc = T.alloc_buffer((ROW_TILE * ROWS,), "float32")
                    w = T.alloc_buffer((WORDS * ROWS,), "int32")
                    for i in T.unroll(ROW_TILE):
                        acc[_v(i * ROWS)] = T.Broadcast(T.float32(0), ROWS)
                    for g in range(groups):
                        # the stream ahead (the next tasks' blocks, contiguous): one group's
                        # lines per group, AHEAD_BYTES on (cold weights: 12 -> 19.6 GB/s here)
                        for c in T.unroll(chunks):
                            T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(
                                words[T.min(nb + (g + ahead) // groups, blocks - 1),
                                      (g + ahead) % groups, c, 0]), 0, 3, 1))
                            if nibbles:
                                w[_v(2 * c * ROWS)] = words[nb, g, c, _v(0)] \
                                    & T.Broadcast(0x0F0F0F0F, ROWS)
                                w[_v((2 * c + 1) * ROWS)] = T.shift_right(
                                    words[nb, g, c, _v(0)], T.Broadcast(4, ROWS)) \
                                    & T.Broadcast(0x0F0F0F0F, ROWS)
                            else:
                                w[_v(c * ROWS)] = words[nb, g, c, _v(0)]
                        for i in T.unroll(ROW_TILE):
                            if mt * ROW_TILE + i < m:
                                acc[_v(i * ROWS)] = acc[_v(i * ROWS)] + T.Cast(
                                    "float32x16",
                                    _dot(_dot(_dot(_dot(
                                        T.Broadcast(0, ROWS) - T.Broadcast(
                                            xc[mt * ROW_TILE + i, g], ROWS),
                                        w[_v(0 * ROWS)],
                                        _word(xq, mt * ROW_TILE + i, g * GROUP + 0)),
                                        w[_v(2 * ROWS)],
                                        _word(xq, mt * ROW_TILE + i, g * GROUP + 8)),
                                        w[_v(4 * ROWS)],
                                        _word(xq, mt * ROW_TILE + i, g * GROUP + 16)),
                                        w[_v(6 * ROWS)],
                                        _word(xq, mt * ROW_TILE + i, g * GROUP + 24))
                                    + _dot(_dot(_dot(_dot(
                                        T.Broadcast(0, ROWS),
                                        w[_v(1 * ROWS)],
                                        _word(xq, mt * ROW_TILE + i, g * GROUP + 4)),
                                        w[_v(3 * ROWS)],
                                        _word(xq, mt * ROW_TILE + i, g * GROUP + 12)),
                                        w[_v(5 * ROWS)],
                                        _word(xq, mt * ROW_TILE + i, g * GROUP + 20)),
                                        w[_v(7 * ROWS)],
                                        _word(xq, mt * ROW_TILE + i, g * GROUP + 28))) \
                                    * (scales[nb, g, _v(0)]
                                       * T.Broadcast(xs[mt * ROW_TILE + i, g], ROWS))
                    for i in T.unroll(ROW_TILE):
                        if mt * ROW_TILE + i < m:
                            y[mt * ROW_TILE + i, _v(nb * ROWS)] = acc[_v(i * ROWS)]

    return quant_matmul


def gather_rows_kernel(fmt: QuantFormat, n: int, k: int) -> tirx.PrimFunc:
    """``(ids[m] int64, words, scales) -> rows[m, k] float32``: an embedding lookup in a
    quantized table (the rows dequantized; a tied LM head and embedding share one table)."""
    blocks, groups, chunks, bits = n // ROWS, k // GROUP, fmt.chunks, fmt.bits
    per_word = 32 // bits  # codes per int32 word

    @T.prim_func(private=True, s_tir=True)
    def gather_rows(ids_var: T.handle,
                    words: T.Buffer((blocks, groups, chunks, ROWS), "int32"),
                    scales: T.Buffer((blocks, groups, ROWS), "float32"), out_var: T.handle):
        T.func_attr({"tirx.noalias": True})
        m = T.int64()
        ids = T.match_buffer(ids_var, (m,), "int64")
        out = T.match_buffer(out_var, (m, k), "float32")
        with T.sblock("root"):  # (Relax's reshape check wants a root block)
            for r in T.parallel(m):
                for g, c, j in T.grid(groups, chunks, per_word):
                    out[r, g * GROUP + c * per_word + j] = T.Cast("float32", T.Cast(
                        "int32", T.shift_right(
                            words[ids[r] // ROWS, g, c, ids[r] % ROWS],
                            _code_shift(bits, j)) & ((1 << bits) - 1)) - (1 << (bits - 1))) \
                        * scales[ids[r] // ROWS, g, ids[r] % ROWS]

    return gather_rows


def _code_shift(bits: int, j):
    """Where code ``j`` of a word sits (see ``quant_format``): int8 byte ``j``; int4 the low
    nibbles of bytes 0-3, then their high nibbles."""
    if bits == 8:
        return j * 8
    return (j % 4) * 8 + (j // 4) * 4
