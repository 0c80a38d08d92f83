"""Intel AMX tile products as a micro-kernel route: ``C[32, 32] += A[32, kc] · B[kc, 32]``.

The kernel keeps a 2×2 block of 16×16 accumulator tiles (fp32 for bf16 operands, int32 for
int8) in the tile registers over the chunk; each step loads two A tiles and two B tiles (16 rows
× 64 bytes each) and issues four tile products (``tdpbf16ps`` / ``tdpb[su][su]d``: 16×16×32
bf16 or 16×16×64 int8 multiply-adds each). A is read as 1 KiB tiles (``a_rows`` 16 ×
``a_k`` one 64-byte row: rows of a row-major A 2 KiB apart fall into two L1 sets and 32 rows of a
step evict each other; packed A measured 2× on 1024³), B in the instruction's pairs / quads.

The IR uses the fixed-register AMX intrinsics (tiles 0-3 accumulate, 4-5 hold A, 6-7 hold B),
sets the tile configuration on entry and asks Linux once per process for the AMX state
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)``: without it the first tile instruction faults).
"""
from __future__ import annotations

from typing import List

from tvm_roller.backends.cpu.microkernel.route import BF16, S8S8, S8U8, U8S8, U8U8, Operands, \
    Route, Shape
from tvm_roller.hardware.model import DeviceModel

TILE_ROWS = 16  # rows of an accumulator tile (and of A and B tiles)
TILE_BYTES = 64  # bytes of a tile row
BLOCK = 32  # the micro-kernel's output block per axis: 2 tiles of 16
_INSTRUCTION = {BF16: "tdpbf16ps", U8S8: "tdpbusd", S8S8: "tdpbssd", U8U8: "tdpbuud",
                S8U8: "tdpbsud"}
# one core's sustained rate of the 2×2 kernel over L1/L2-resident operands (GFLOP/s, GOP/s)
# before calibration, from the Xeon (Emerald Rapids) it was written on: 1024³ bf16 at
# 1000-1400 GF/s on two cores; int8's instruction is twice that
_PRESET_GOPS = {"float32": 700.0, "int32": 1400.0}


def has_int8_tiles(target) -> bool:
    """Whether ``target`` has AMX's int8 tile products."""
    from tvm.target import codegen

    return str(target.kind) == "llvm" and bool(codegen.target_has_features("amx-int8", target))


class AmxRoute(Route):
    """The tile products of one AMX feature (``amx-bf16``, ``amx-int8``)."""

    def __init__(self, name: str, feature: str, operands: tuple):
        self.name, self.feature, self.operands = name, feature, operands
        self.instruction = "/".join(_INSTRUCTION[o] for o in operands)

    def available(self, dev: DeviceModel) -> bool:
        return self.feature in (dev.cpu.matrix_units if dev.cpu else ())

    def shapes(self, dev: DeviceModel, ops: Operands) -> List[Shape]:
        g = 4 // ops.elem_bytes
        return [Shape(BLOCK, BLOCK, TILE_ROWS, TILE_BYTES // ops.elem_bytes, TILE_ROWS, g)]

    def preset_gops(self, dev: DeviceModel, ops: Operands, shape: Shape) -> float:
        return _PRESET_GOPS[ops.acc]

    def kernel_ir(self, ops: Operands, shape: Shape) -> str:
        """``steps`` products of 1 KiB A and B tiles into C's 2×2 tiles (``route``'s
        signature; ``lda`` / ``ldb``: from one 16-row panel of A / 16-column panel of B to the
        next)."""
        ins = f"@llvm.x86.{_INSTRUCTION[ops]}"
        lines = [
            f"@tvm_roller_amx_cfg = linkonce_odr constant [64 x i8] [{_config_ir()}], align 64",
            "@tvm_roller_amx_ready = linkonce_odr global i32 0",
            "declare i64 @syscall(i64, ...)",
            "declare void @llvm.x86.ldtilecfg(ptr)",
            "declare void @llvm.x86.tileloadd64(i8 immarg, ptr, i64)",
            "declare void @llvm.x86.tilestored64(i8 immarg, ptr, i64)",
            f"declare void {ins}(i8 immarg, i8 immarg, i8 immarg)",
            f"define linkonce_odr void @{self.symbol(ops, shape)}(ptr %c, i64 %ldc, ptr %a, "
            "i64 %lda, ptr %b, i64 %ldb, i64 %steps) {",
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
                          f"  call void @llvm.x86.tileloadd64(i8 {2 * i + j}, ptr %cp{i}{j}, "
                          "i64 %ldc)"]
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


def _config_ir() -> str:
    """The 64-byte tile configuration: palette 1, eight tiles of 16 rows × 64 bytes."""
    cfg = [0] * 64
    cfg[0] = 1
    for t in range(8):
        cfg[16 + 2 * t] = TILE_BYTES
        cfg[48 + t] = TILE_ROWS
    return ", ".join(f"i8 {b}" for b in cfg)


AMX_BF16 = AmxRoute("amx_bf16", "amx-bf16", (BF16,))
AMX_INT8 = AmxRoute("amx_int8", "amx-int8", (U8S8, S8S8, U8U8, S8U8))
