"""B's copy into a micro-kernel's panel layout, ``L`` columns × one group of ``g`` reduction
elements at a time (``Bp[.., n // L, k // g, n % L, k % g]``), as a tensor intrinsic of LLVM IR:
for a B the kernel reads in every call (not a constant packed while compiling)."""
from __future__ import annotations

from typing import Dict, Tuple

from tvm import s_tir
from tvm.script import tirx as T

from tvm_roller.hardware.model import dtype_bytes

_REGISTERED: Dict[Tuple[int, int, str, bool], str] = {}


def storage(dtype: str) -> str:
    """The dtype an intrinsic's impl views a buffer as: bfloat16 buffers become uint16 storage
    in TVM's legalization, so no bfloat16 value is ever formed."""
    return "uint16" if dtype == "bfloat16" else dtype


def _lane_type(dtype: str) -> str:
    return f"i{8 * dtype_bytes(dtype)}"


def symbol(lanes: int, g: int, dtype: str, k_contiguous: bool) -> str:
    return f"tvm_roller_pack{lanes}x{g}_{_lane_type(dtype)}_{'kn'[k_contiguous]}"


def pack_ir(lanes: int, g: int, dtype: str, k_contiguous: bool) -> str:
    """``void f(ptr dst, ptr src, i64 stride)``: ``lanes`` columns × ``g`` reduction elements
    (``dst[c·g + r] = B[r, c]``). ``k_contiguous``: the source holds each column's ``g``
    elements side by side (rows ``stride`` bytes apart: one ``g``-element load each); else ``g``
    rows of ``lanes`` contiguous elements ``stride`` bytes apart, interleaved by shuffles."""
    ty, name = _lane_type(dtype), symbol(lanes, g, dtype, k_contiguous)
    word = f"i{g * 8 * dtype_bytes(dtype)}"
    lines = [f"define linkonce_odr void @{name}(ptr %dst, ptr %src, i64 %stride) {{", "entry:"]
    if k_contiguous:
        lines.append(f"  %v0 = insertelement <{lanes} x {word}> poison, {word} 0, i32 0")
        for c in range(lanes):
            lines += [f"  %o{c} = mul i64 %stride, {c}",
                      f"  %p{c} = getelementptr i8, ptr %src, i64 %o{c}",
                      f"  %x{c} = load {word}, ptr %p{c}, align 1",
                      f"  %v{c + 1} = insertelement <{lanes} x {word}> %v{c}, {word} %x{c}, i32 {c}"]
        lines += [f"  store <{lanes} x {word}> %v{lanes}, ptr %dst, align 1", "  ret void", "}"]
        return "\n".join(lines) + "\n"
    for r in range(g):
        lines += [f"  %o{r} = mul i64 %stride, {r}",
                  f"  %p{r} = getelementptr i8, ptr %src, i64 %o{r}",
                  f"  %r0_{r} = load <{lanes} x {ty}>, ptr %p{r}, align 1"]
    width, level = lanes, 0
    while width < lanes * g:  # concatenate the rows pairwise
        for j in range(lanes * g // (2 * width)):
            lines.append(f"  %r{level + 1}_{j} = shufflevector <{width} x {ty}> %r{level}_{2 * j}, "
                         f"<{width} x {ty}> %r{level}_{2 * j + 1}, <{2 * width} x i32> "
                         f"<{_mask(range(2 * width))}>")
        width, level = 2 * width, level + 1
    n = lanes * g
    order = [(i % g) * lanes + i // g for i in range(n)]
    lines += [f"  %out = shufflevector <{n} x {ty}> %r{level}_0, <{n} x {ty}> poison, "
              f"<{n} x i32> <{_mask(order)}>",
              f"  store <{n} x {ty}> %out, ptr %dst, align 1", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def _mask(values) -> str:
    return ", ".join(f"i32 {v}" for v in values)


def pack_intrin_name(lanes: int, g: int, dtype: str, k_contiguous: bool) -> str:
    """The registered tensor intrinsic copying ``lanes`` columns × one group of B."""
    key = (lanes, g, dtype, k_contiguous)
    if key not in _REGISTERED:
        name = "tvm_roller_" + symbol(lanes, g, dtype, k_contiguous)
        s_tir.TensorIntrin.register(name, *_desc_impl(lanes, g, dtype, k_contiguous),
                                    override=True)
        _REGISTERED[key] = name
    return _REGISTERED[key]


def _desc_impl(lanes: int, g: int, dt: str, k_contiguous: bool):
    st, esz = storage(dt), dtype_bytes(dt)
    src_shape = (lanes, g) if k_contiguous else (g, lanes)
    sym = symbol(lanes, g, dt, k_contiguous)

    def src_index(c, r):
        return (c, r) if k_contiguous else (r, c)

    @T.prim_func(s_tir=True)
    def desc(s: T.handle, d: T.handle):
        ss = T.int32()
        S = T.match_buffer(s, src_shape, dt, strides=[ss, 1], offset_factor=1)
        D = T.match_buffer(d, (lanes, g), dt, offset_factor=1)
        with T.sblock("root"):
            T.reads(S[0:src_shape[0], 0:src_shape[1]])
            T.writes(D[0:lanes, 0:g])
            for c, r in T.grid(lanes, g):
                with T.sblock("copy"):
                    vc, vr = T.axis.remap("SS", [c, r])
                    D[vc, vr] = S[src_index(vc, vr)]

    @T.prim_func(s_tir=True)
    def impl(s: T.handle, d: T.handle):
        ss = T.int32()
        S = T.match_buffer(s, src_shape, dt, strides=[ss, 1], offset_factor=1)
        D = T.match_buffer(d, (lanes, g), dt, offset_factor=1)
        with T.sblock("root"):
            T.reads(S[0:src_shape[0], 0:src_shape[1]])
            T.writes(D[0:lanes, 0:g])
            Ss = T.decl_buffer(src_shape, st, data=S.data, strides=[ss, 1],
                               elem_offset=S.elem_offset)
            Ds = T.decl_buffer((lanes, g), st, data=D.data, elem_offset=D.elem_offset)
            T.evaluate(T.call_extern("void", sym, Ds.access_ptr("w"), Ss.access_ptr("r"),
                                     T.Cast("int64", ss) * esz))

    return desc, impl
