"""Intel AMX tile products as a TVM tensor intrinsic: ``C[32, 32] += A[32, kc] · B[kc, 32]``.

The micro-kernel keeps a 2×2 block of 16×16 accumulator tiles (fp32 for bf16 operands, int32
for int8) in the tile registers over a reduction chunk of ``kc`` elements; each step loads two A
tiles and two B tiles (16 rows × 64 bytes each) and issues four tile products (``tdpbf16ps`` /
``tdpb[su][su]d``: 16×16×32 bf16 or 16×16×64 int8 multiply-adds each).

Both operands are read as contiguous 1 KiB tiles, in the layouts the lowering packs them into
(``lower_amx``): A as ``Ap[m // 16, k // s, m % 16, k % s]`` (``s``: the reduction elements of
a 64-byte row), B in the instruction's pairs / quads — for each 16 output columns, the
reduction in groups of ``g`` (2 bf16 / 4 int8: the 4 bytes one fp32 / int32 lane accumulates
per product) with the 16 columns side by side, ``Bp[n // 16, k // g, n % 16, k % g]``. (Rows
of a row-major A 2 KiB apart fall into two L1 sets: 32 rows of a step then evict each other;
packed A measured 2× on 1024³.)

The micro-kernel is LLVM IR (``pragma_import_llvm``): TVM's LLVM code generator has no AMX tile
type, and its bfloat16 legalization would rewrite bf16 operands of an intrinsic call. The IR
uses the fixed-register AMX intrinsics (tiles 0-3 accumulate, 4-5 hold A, 6-7 hold B), sets the
tile configuration on entry and asks Linux once per process for the AMX state
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)``: without it the first tile instruction faults).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from tvm import s_tir
from tvm.script import tirx as T

TILE_ROWS = 16  # rows of an accumulator tile (and of A and B tiles)
TILE_BYTES = 64  # bytes of a tile row
BLOCK = 32  # the micro-kernel's output block per axis: 2 tiles of 16


@dataclass(frozen=True)
class AmxKind:
    """One AMX product: operand dtypes, accumulator dtype, instruction, LLVM feature."""

    name: str
    a_dtype: str
    b_dtype: str
    acc_dtype: str
    instruction: str
    feature: str

    @property
    def kgroup(self) -> int:
        """Reduction elements one accumulator lane takes per product (4 bytes of operands)."""
        return 2 if self.a_dtype == "bfloat16" else 4

    @property
    def kstep(self) -> int:
        """Reduction elements per tile product (a 64-byte A tile row)."""
        return TILE_BYTES // (2 if self.a_dtype == "bfloat16" else 1)

    @property
    def elem_bytes(self) -> int:
        return 2 if self.a_dtype == "bfloat16" else 1


KINDS: Tuple[AmxKind, ...] = (
    AmxKind("bf16", "bfloat16", "bfloat16", "float32", "tdpbf16ps", "amx-bf16"),
    AmxKind("u8s8", "uint8", "int8", "int32", "tdpbusd", "amx-int8"),
    AmxKind("s8s8", "int8", "int8", "int32", "tdpbssd", "amx-int8"),
    AmxKind("u8u8", "uint8", "uint8", "int32", "tdpbuud", "amx-int8"),
    AmxKind("s8u8", "int8", "uint8", "int32", "tdpbsud", "amx-int8"),
)

#: operand dtypes an AMX product takes (the analysis lets them into a tiled kernel)
OPERAND_DTYPES = ("bfloat16", "int8", "uint8")


def has_int8_tiles(target) -> bool:
    """Whether ``target`` has AMX's int8 tile products."""
    from tvm.target import codegen

    return str(target.kind) == "llvm" and bool(codegen.target_has_features("amx-int8", target))


def kind_for(a_dtype: str, b_dtype: str, acc_dtype: str) -> Optional[AmxKind]:
    """The AMX product of these operand and accumulator dtypes, or None."""
    return next((k for k in KINDS if (k.a_dtype, k.b_dtype, k.acc_dtype) ==
                 (a_dtype, b_dtype, acc_dtype)), None)


# -- the micro-kernel in LLVM IR --------------------------------------------------------------------


def _config_ir() -> str:
    """The 64-byte tile configuration: palette 1, eight tiles of 16 rows × 64 bytes."""
    cfg = [0] * 64
    cfg[0] = 1
    for t in range(8):
        cfg[16 + 2 * t] = TILE_BYTES
        cfg[48 + t] = TILE_ROWS
    return ", ".join(f"i8 {b}" for b in cfg)


def kernel_symbol(kind: AmxKind) -> str:
    return f"tvm_roller_amx_{kind.name}_2x2"


def kernel_ir(kind: AmxKind) -> str:
    """``void f(ptr c, i64 ldc, ptr a, i64 lda, ptr b, i64 ldb, i64 steps)`` (strides in bytes;
    ``lda`` / ``ldb``: from one 16-row panel of A / 16-column panel of B to the next; a step
    moves 1 KiB along both): C's 2×2 tiles += ``steps`` products."""
    ins = f"@llvm.x86.{kind.instruction}"
    lines = [
        f"@tvm_roller_amx_cfg = linkonce_odr constant [64 x i8] [{_config_ir()}], align 64",
        "@tvm_roller_amx_ready = linkonce_odr global i32 0",
        "declare i64 @syscall(i64, ...)",
        "declare void @llvm.x86.ldtilecfg(ptr)",
        "declare void @llvm.x86.tileloadd64(i8 immarg, ptr, i64)",
        "declare void @llvm.x86.tilestored64(i8 immarg, ptr, i64)",
        f"declare void {ins}(i8 immarg, i8 immarg, i8 immarg)",
        f"define linkonce_odr void @{kernel_symbol(kind)}(ptr %c, i64 %ldc, ptr %a, i64 %lda, "
        "ptr %b, i64 %ldb, i64 %steps) {",
        "entry:",
        "  %ready = load i32, ptr @tvm_roller_amx_ready",
        "  %isready = icmp ne i32 %ready, 0",
        "  br i1 %isready, label %go, label %ask",
        "ask:",  # SYS_arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
        "  %r = call i64 (i64, ...) @syscall(i64 158, i64 4131, i64 18)",
        "  store i32 1, ptr @tvm_roller_amx_ready",
        "  br label %go",
        "go:",
        "  call void @llvm.x86.ldtilecfg(ptr @tvm_roller_amx_cfg)",
        "  %c16 = mul i64 %ldc, 16",
    ]
    for i in range(2):
        for j in range(2):
            lines += [f"  %co{i}{j}.r = mul i64 %c16, {i}",
                      f"  %co{i}{j} = add i64 %co{i}{j}.r, {TILE_BYTES * j}",
                      f"  %cp{i}{j} = getelementptr i8, ptr %c, i64 %co{i}{j}",
                      f"  call void @llvm.x86.tileloadd64(i8 {2 * i + j}, ptr %cp{i}{j}, i64 %ldc)"]
    lines += ["  br label %loop", "loop:",
              "  %s = phi i64 [0, %go], [%s1, %loop]",
              f"  %ao = mul i64 %s, {TILE_BYTES * TILE_ROWS}",
              f"  %bo = mul i64 %s, {TILE_BYTES * TILE_ROWS}",
              "  %ao1 = add i64 %ao, %lda",
              "  %bo1 = add i64 %bo, %ldb"]
    for i, off in enumerate(("%ao", "%ao1")):
        lines += [f"  %ap{i} = getelementptr i8, ptr %a, i64 {off}",
                  f"  call void @llvm.x86.tileloadd64(i8 {4 + i}, ptr %ap{i}, i64 {TILE_BYTES})"]
    for j, off in enumerate(("%bo", "%bo1")):
        lines += [f"  %bp{j} = getelementptr i8, ptr %b, i64 {off}",
                  f"  call void @llvm.x86.tileloadd64(i8 {6 + j}, ptr %bp{j}, i64 {TILE_BYTES})"]
    for i in range(2):
        for j in range(2):
            lines.append(f"  call void {ins}(i8 {2 * i + j}, i8 {4 + i}, i8 {6 + j})")
    lines += ["  %s1 = add i64 %s, 1", "  %more = icmp ult i64 %s1, %steps",
              "  br i1 %more, label %loop, label %done", "done:"]
    for i in range(2):
        for j in range(2):
            lines.append(f"  call void @llvm.x86.tilestored64(i8 {2 * i + j}, ptr %cp{i}{j}, "
                         "i64 %ldc)")
    lines += ["  ret void", "}"]
    return "\n".join(lines) + "\n"


# -- the tensor intrinsic ---------------------------------------------------------------------------

_REGISTERED: Dict[Tuple[str, int, str], str] = {}


def _storage(dtype: str) -> str:
    # bfloat16 buffers become uint16 storage in TVM's legalization; the impl's pointers are
    # taken of uint16 views so no bfloat16 value is ever formed
    return "uint16" if dtype == "bfloat16" else dtype


def intrin_name(kind: AmxKind, kc: int, acc_scope: str = "local") -> str:
    """The registered tensor intrinsic for ``kind`` over a reduction chunk of ``kc``."""
    key = (kind.name, kc, acc_scope)
    if key not in _REGISTERED:
        name = f"tvm_roller_amx_{kind.name}_k{kc}_{acc_scope}"
        s_tir.TensorIntrin.register(name, *_desc_impl(kind, kc, acc_scope), override=True)
        _REGISTERED[key] = name
    return _REGISTERED[key]


def _desc_impl(kind: AmxKind, kc: int, acc_scope: str):
    g, acc, a_dt, b_dt = kind.kgroup, kind.acc_dtype, kind.a_dtype, kind.b_dtype
    a_st, b_st, esz, acc_sz = _storage(a_dt), _storage(b_dt), kind.elem_bytes, 4
    steps, sym, ks = kc // kind.kstep, kernel_symbol(kind), kind.kstep

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (2, kc // ks, 16, ks), a_dt, strides=[sa, 16 * ks, ks, 1],
                           offset_factor=1)
        B = T.match_buffer(b, (2, kc // g, 16, g), b_dt, strides=[sb, 16 * g, g, 1],
                           offset_factor=1)
        C = T.match_buffer(c, (BLOCK, BLOCK), acc, strides=[sc, 1], offset_factor=1,
                           scope=acc_scope)
        with T.sblock("root"):
            T.reads(C[0:BLOCK, 0:BLOCK], A[0:2, 0:kc // ks, 0:16, 0:ks],
                    B[0:2, 0:kc // g, 0:16, 0:g])
            T.writes(C[0:BLOCK, 0:BLOCK])
            for k, m, n in T.grid(kc, BLOCK, BLOCK):
                with T.sblock("update"):
                    vm, vn, vk = T.axis.remap("SSR", [m, n, k])
                    C[vm, vn] = C[vm, vn] + T.Cast(acc, A[vm // 16, vk // ks, vm % 16, vk % ks]) * \
                        T.Cast(acc, B[vn // 16, vk // g, vn % 16, vk % g])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (2, kc // ks, 16, ks), a_dt, strides=[sa, 16 * ks, ks, 1],
                           offset_factor=1)
        B = T.match_buffer(b, (2, kc // g, 16, g), b_dt, strides=[sb, 16 * g, g, 1],
                           offset_factor=1)
        C = T.match_buffer(c, (BLOCK, BLOCK), acc, strides=[sc, 1], offset_factor=1,
                           scope=acc_scope)
        with T.sblock("root"):
            T.reads(C[0:BLOCK, 0:BLOCK], A[0:2, 0:kc // ks, 0:16, 0:ks],
                    B[0:2, 0:kc // g, 0:16, 0:g])
            T.writes(C[0:BLOCK, 0:BLOCK])
            As = T.decl_buffer((2, kc // ks, 16, ks), a_st, data=A.data,
                               strides=[sa, 16 * ks, ks, 1], elem_offset=A.elem_offset)
            Bs = T.decl_buffer((2, kc // g, 16, g), b_st, data=B.data,
                               strides=[sb, 16 * g, g, 1], elem_offset=B.elem_offset)
            T.evaluate(T.call_extern("void", sym, C.access_ptr("rw"),
                                     T.Cast("int64", sc) * acc_sz,
                                     As.access_ptr("r"), T.Cast("int64", sa) * esz,
                                     Bs.access_ptr("r"), T.Cast("int64", sb) * esz,
                                     T.int64(steps)))

    return desc, impl


# -- B's copy into the instruction's layout, 16 columns × one group at a time --------------------


def _lanes_type(kind: AmxKind) -> str:
    return "i16" if kind.elem_bytes == 2 else "i8"


def pack_symbol(kind: AmxKind, k_contiguous: bool) -> str:
    return f"tvm_roller_amx_pack{kind.kgroup}_{_lanes_type(kind)}_{'kn'[k_contiguous]}"


def pack_ir(kind: AmxKind, k_contiguous: bool) -> str:
    """``void f(ptr dst, ptr src, i64 stride)``: 16 columns × ``g`` reduction elements into the
    64-byte row of the instruction's layout (``dst[c·g + r] = B[r, c]``). ``k_contiguous``: the
    source holds each column's ``g`` elements side by side (rows ``stride`` bytes apart: 16
    four-byte loads); else ``g`` rows of 16 contiguous elements ``stride`` bytes apart,
    interleaved by one shuffle."""
    g, ty, name = kind.kgroup, _lanes_type(kind), pack_symbol(kind, k_contiguous)
    lines = [f"define linkonce_odr void @{name}(ptr %dst, ptr %src, i64 %stride) {{", "entry:"]
    if k_contiguous:
        lines.append("  %v0 = insertelement <16 x i32> poison, i32 0, i32 0")
        for c in range(16):
            lines += [f"  %o{c} = mul i64 %stride, {c}",
                      f"  %p{c} = getelementptr i8, ptr %src, i64 %o{c}",
                      f"  %x{c} = load i32, ptr %p{c}, align 1",
                      f"  %v{c + 1} = insertelement <16 x i32> %v{c}, i32 %x{c}, i32 {c}"]
        lines += ["  store <16 x i32> %v16, ptr %dst, align 1", "  ret void", "}"]
        return "\n".join(lines) + "\n"
    for r in range(g):
        lines += [f"  %o{r} = mul i64 %stride, {r}",
                  f"  %p{r} = getelementptr i8, ptr %src, i64 %o{r}",
                  f"  %r{r} = load <16 x {ty}>, ptr %p{r}, align 1"]
    if g == 2:
        lines.append(f"  %cat = shufflevector <16 x {ty}> %r0, <16 x {ty}> %r1, <32 x i32> "
                     f"<{_mask(range(32))}>")
    else:
        lines += [f"  %c01 = shufflevector <16 x {ty}> %r0, <16 x {ty}> %r1, <32 x i32> "
                  f"<{_mask(range(32))}>",
                  f"  %c23 = shufflevector <16 x {ty}> %r2, <16 x {ty}> %r3, <32 x i32> "
                  f"<{_mask(range(32))}>",
                  f"  %cat = shufflevector <32 x {ty}> %c01, <32 x {ty}> %c23, <64 x i32> "
                  f"<{_mask(range(64))}>"]
    n = 16 * g
    order = [(i % g) * 16 + i // g for i in range(n)]
    lines += [f"  %out = shufflevector <{n} x {ty}> %cat, <{n} x {ty}> poison, <{n} x i32> "
              f"<{_mask(order)}>",
              f"  store <{n} x {ty}> %out, ptr %dst, align 1", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def _mask(values) -> str:
    return ", ".join(f"i32 {v}" for v in values)


def pack_intrin_name(kind: AmxKind, k_contiguous: bool) -> str:
    """The registered tensor intrinsic copying 16 columns × one group of B (see ``pack_ir``)."""
    key = (f"pack_{kind.name}", int(k_contiguous), "")
    if key not in _REGISTERED:
        name = f"tvm_roller_amx_pack_{kind.name}_{'kn'[k_contiguous]}"
        s_tir.TensorIntrin.register(name, *_pack_desc_impl(kind, k_contiguous), override=True)
        _REGISTERED[key] = name
    return _REGISTERED[key]


def _pack_desc_impl(kind: AmxKind, k_contiguous: bool):
    g, dt, st, esz = kind.kgroup, kind.b_dtype, _storage(kind.b_dtype), kind.elem_bytes
    src_shape = (16, g) if k_contiguous else (g, 16)
    sym = pack_symbol(kind, k_contiguous)

    def src_index(c, r):
        return (c, r) if k_contiguous else (r, c)

    @T.prim_func(s_tir=True)
    def desc(s: T.handle, d: T.handle):
        ss = T.int32()
        S = T.match_buffer(s, src_shape, dt, strides=[ss, 1], offset_factor=1)
        D = T.match_buffer(d, (16, g), dt, offset_factor=1)
        with T.sblock("root"):
            T.reads(S[0:src_shape[0], 0:src_shape[1]])
            T.writes(D[0:16, 0:g])
            for c, r in T.grid(16, g):
                with T.sblock("copy"):
                    vc, vr = T.axis.remap("SS", [c, r])
                    D[vc, vr] = S[src_index(vc, vr)]

    @T.prim_func(s_tir=True)
    def impl(s: T.handle, d: T.handle):
        ss = T.int32()
        S = T.match_buffer(s, src_shape, dt, strides=[ss, 1], offset_factor=1)
        D = T.match_buffer(d, (16, g), dt, offset_factor=1)
        with T.sblock("root"):
            T.reads(S[0:src_shape[0], 0:src_shape[1]])
            T.writes(D[0:16, 0:g])
            Ss = T.decl_buffer(src_shape, st, data=S.data, strides=[ss, 1],
                               elem_offset=S.elem_offset)
            Ds = T.decl_buffer((16, g), st, data=D.data, elem_offset=D.elem_offset)
            T.evaluate(T.call_extern("void", sym, Ds.access_ptr("w"), Ss.access_ptr("r"),
                                     T.Cast("int64", ss) * esz))

    return desc, impl
