"""A linear layer over group-quantized weights (``quant_format``) in integer dot products:
``y[m, n] = Σ_g sw[n, g] · sx[m, g] · Σ_{k in g} x_q[m, k] · (u[n, k] − offset)``.

Two kernels, built from a dot-product route (``microkernel.quant_dot``: the instruction, its
lanes and which offset its weight bytes keep — every ISA-specific part):

* ``quantize_rows``: each activation row in groups of 32 → int8 codes ``x_q`` (scale
  ``sx = max|x| / 127``), ``sx`` and ``offset · Σ x_q`` per group (the offset the route's
  weight bytes keep, taken back once per group instead of once per weight; 0 for a route
  that takes int8 weights as signed bytes);
* ``matmul``: its weight may be a view into a larger tensor (one expert of a mixture's
  stacked experts: its words and scales take a buffer offset, a multiple of 16 elements); a
  task is a block of 16 output rows (one int32 lane each, in ``16 / lanes``
  vectors); per group it loads their packed codes once (int4: 4 words a lane, unpacked by an
  AND and a shift + AND into 8; int8: 8, XORed with 0x80 for a signed route), then for each of
  ``ROW_TILE`` activation rows runs 8 route dots per vector (4 products a lane each: weight
  bytes × the activation word broadcast) in two independent chains, and one float step:
  ``acc += float(dot − correction) · (sw · sx)``.

The weights are read at their packed size (int4: 0.625 bytes a weight with its scale) and
decoded in registers; the products are exact in int32, the groups' sums in float32. Per 512
weights this is (AVX-512 VNNI) 8 dot products and ~12 unpacking operations against 64
``vfmadd`` and ~96 conversions for a float32 dequantization — why the activations are
quantized (as llama.cpp's q8_0 activations for its q4_0 / q8_0 weights).

One task's unpacked group (8 words a lane) is reused across ``ROW_TILE`` activation rows (a
prefill's GEMM), whose float accumulators stay in registers: 8 + ``ROW_TILE`` vector registers
on a 16-lane route.
"""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvm_roller.backends.cpu.microkernel.quant_dot import QuantDotRoute
from tvm_roller.backends.cpu.quant_format import GROUP, ROWS, QuantFormat

ROW_TILE = 8  # activation rows per pass over a group's unpacked weights
AHEAD_BYTES = 8192  # how far ahead the weights are prefetched (measured: 4-16 KiB alike)
WORDS = GROUP // 4  # int32 words of int8 activations per group
_NIBBLES = 0x0F0F0F0F


def quantize_rows_kernel(fmt: QuantFormat, k: int, route: QuantDotRoute) -> tirx.PrimFunc:
    """``(x[m, k] float32) -> x_q[m, k] int8, sx[m, k/32] float32, corr[m, k/32] int32``
    (``corr``: ``route.offset(fmt) · Σ x_q`` per group)."""
    groups, offset = k // GROUP, route.offset(fmt)
    corrected = offset != 0

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
                    if corrected:
                        for j in range(GROUP):
                            total[0] = total[0] + T.Cast("int32", xq[r, g * GROUP + j])
                    xs[r, g] = scale
                    xc[r, g] = total[0] * offset

    return quantize_rows


def _v(base, lanes: int):
    """``lanes`` consecutive elements from ``base``."""
    return T.ramp(base, 1, lanes)


def _word(xq, row, k, lanes: int):
    """Four int8 activation codes from ``k`` on as one int32, in every lane."""
    return T.Broadcast(T.reinterpret("int32", xq[row, T.ramp(k, 1, 4)]), lanes)


def _unpacked(fmt: QuantFormat, route: QuantDotRoute, word, half: int):
    """A loaded word vector's codes as the route's dot takes them: int4 the low (``half`` 0)
    or high nibbles, one code a byte; int8 as stored, or signed (XOR 0x80) for a signed
    route."""
    lanes = route.lanes
    if fmt.bits == 4:
        if half:
            word = T.shift_right(word, T.Broadcast(4, lanes))
        return word & T.Broadcast(_NIBBLES, lanes)
    if route.flips(fmt):
        return T.bitwise_xor(word, T.Broadcast(T.int32(-0x7F7F7F80), lanes))  # 0x80808080
    return word


def _group_dot(fmt: QuantFormat, route: QuantDotRoute, w, xq, xc, row, g, s):
    """Sub-vector ``s`` of the block's int32 sum over group ``g`` of activation ``row``, its
    correction taken off: two independent chains of 4 dots (words 0, 2, 4, 6 and 1, 3, 5, 7;
    word ``j`` holds ``k = 4j .. 4j+3`` of the group)."""
    lanes, signed = route.lanes, route.flips(fmt)
    zero = T.Broadcast(0, lanes)
    start = zero - T.Broadcast(xc[row, g], lanes) if route.offset(fmt) else zero
    chains = []
    for first, acc in ((0, start), (1, zero)):
        for j in range(first, WORDS, 2):
            acc = route.dot(acc, w[_v(j * ROWS + s * lanes, lanes)],
                            _word(xq, row, g * GROUP + 4 * j, lanes), signed)
        chains.append(acc)
    return chains[0] + chains[1]


def matmul_kernel(fmt: QuantFormat, n: int, k: int, route: QuantDotRoute) -> tirx.PrimFunc:
    """``(x_q[m, k] int8, sx[m, k/32], corr[m, k/32], words, scales) -> y[m, n] float32``
    (``m`` symbolic: a prompt's tokens), over ``route``'s dot products."""
    blocks, groups, chunks, nibbles = n // ROWS, k // GROUP, fmt.chunks, fmt.bits == 4
    lanes = route.lanes
    vecs = ROWS // lanes  # vectors per block of 16 rows
    ahead = AHEAD_BYTES // (chunks * ROWS * 4)  # in groups
    f32 = f"float32x{lanes}"

    @T.prim_func(private=True, s_tir=True)
    def quant_matmul(q_var: T.handle, s_var: T.handle, c_var: T.handle,
                     words: T.Buffer((blocks, groups, chunks, ROWS), "int32",
                                     offset_factor=ROWS),
                     scales: T.Buffer((blocks, groups, ROWS), "float32", offset_factor=ROWS),
                     y_var: T.handle):
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
                    for i in T.unroll(ROW_TILE * vecs):
                        acc[_v(i * lanes, lanes)] = T.Broadcast(T.float32(0), lanes)
                    for g in range(groups):
                        # the stream ahead (the next tasks' blocks, contiguous): one group's
                        # lines per group, AHEAD_BYTES on (cold weights: 12 -> 19.6 GB/s here)
                        for c in T.unroll(chunks):
                            T.evaluate(T.call_intrin("void", "tirx.prefetch", T.address_of(
                                words[T.min(nb + (g + ahead) // groups, blocks - 1),
                                      (g + ahead) % groups, c, 0]), 0, 3, 1))
                            for s in T.unroll(vecs):
                                if nibbles:
                                    w[_v(2 * c * ROWS + s * lanes, lanes)] = _unpacked(
                                        fmt, route, words[nb, g, c, _v(s * lanes, lanes)], 0)
                                    w[_v((2 * c + 1) * ROWS + s * lanes, lanes)] = _unpacked(
                                        fmt, route, words[nb, g, c, _v(s * lanes, lanes)], 1)
                                else:
                                    w[_v(c * ROWS + s * lanes, lanes)] = _unpacked(
                                        fmt, route, words[nb, g, c, _v(s * lanes, lanes)], 0)
                        for i in T.unroll(ROW_TILE):
                            if mt * ROW_TILE + i < m:
                                for s in T.unroll(vecs):
                                    acc[_v(i * ROWS + s * lanes, lanes)] = \
                                        acc[_v(i * ROWS + s * lanes, lanes)] + T.Cast(
                                            f32, _group_dot(fmt, route, w, xq, xc,
                                                            mt * ROW_TILE + i, g, s)) \
                                        * (scales[nb, g, _v(s * lanes, lanes)]
                                           * T.Broadcast(xs[mt * ROW_TILE + i, g], lanes))
                    for i in T.unroll(ROW_TILE):
                        if mt * ROW_TILE + i < m:
                            for s in T.unroll(vecs):
                                y[mt * ROW_TILE + i, _v(nb * ROWS + s * lanes, lanes)] = \
                                    acc[_v(i * ROWS + s * lanes, lanes)]

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
