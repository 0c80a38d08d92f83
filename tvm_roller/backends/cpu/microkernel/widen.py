"""Routes for any SIMD CPU, of the fp32 / int32 instructions every vector ISA has:

* fp32: a broadcast A element times a B vector, one FMA per accumulator (the SIMD width the
  device model gives: ymm on AVX2, zmm on AVX-512, q registers on NEON);
* bf16 → fp32: a bf16 is the top half of an fp32, so one lane's pair (even, odd) becomes two
  fp32 vectors by a shift and a mask, then two FMAs (what a CPU without a bf16 dot product does);
* int8 pairs → int16 → ``pmaddwd``-style pair products summed into int32 lanes: exact for every
  signedness (255 · 255 · 2 fits an int32 lane). x86 names its instruction (``vpmaddwd`` ymm /
  zmm); elsewhere the IR is the plain widening multiply and add, which LLVM selects for the ISA.
"""
from __future__ import annotations

from typing import List, Optional

from tvm_roller.backends.cpu.microkernel.route import BF16, F32, INT8, Operands
from tvm_roller.backends.cpu.microkernel.vector_dot import VectorRoute, broadcast, splat, vec
from tvm_roller.hardware.model import DeviceModel


def _simd_lanes(dev: DeviceModel) -> int:
    return max(1, dev.simd_bytes // 4)


class _FmaRoute(VectorRoute):
    """fp32 FMAs on whatever SIMD width the device has."""

    def available(self, dev: DeviceModel) -> bool:
        return dev.kind == "cpu" and dev.simd_bytes >= 16

    def lanes(self, dev: DeviceModel) -> int:
        return _simd_lanes(dev)

    def declarations(self, ops: Operands, lanes: int) -> List[str]:
        f = vec(lanes, "float")
        return [f"declare {f} @llvm.fma.v{lanes}f32({f}, {f}, {f})"]


class Fp32Fma(_FmaRoute):
    name, instruction, operands = "fp32_fma", "vfmadd (broadcast A)", (F32,)

    def kgroup(self, ops: Operands) -> int:
        return 1

    def macs_per_instruction(self, ops: Operands, lanes: int) -> float:
        return lanes

    def b_load_type(self, ops: Operands, lanes: int) -> str:
        return vec(lanes, "float")

    def a_word_type(self, ops: Operands) -> str:
        return "float"

    def prepare_b(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        return [f"  {dst} = bitcast {vec(lanes, 'float')} {src} to {vec(lanes, 'float')}"]

    def prepare_a(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        return broadcast(dst, src, lanes, "float")

    def step(self, ops: Operands, lanes: int, acc: str, a: str, b: str, dst: str) -> List[str]:
        f = vec(lanes, "float")
        return [f"  {dst} = call {f} @llvm.fma.v{lanes}f32({f} {a}, {f} {b}, {f} {acc})"]


class Bf16Widen(_FmaRoute):
    name, instruction, operands = "bf16_fma", "bf16 → fp32, vfmadd", (BF16,)
    extra_registers = 2  # A's even and odd halves
    b_registers = 2  # B's even and odd halves

    def kgroup(self, ops: Operands) -> int:
        return 2

    def macs_per_instruction(self, ops: Operands, lanes: int) -> float:
        return lanes * 2 / 2.5  # two FMAs and (amortised) the shifts and masks

    def prepare_b(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        i, f = vec(lanes, "i32"), vec(lanes, "float")
        return [f"  {dst}.e = shl {i} {src}, {splat(lanes, 'i32', 16)}",
                f"  {dst}.o = and {i} {src}, {splat(lanes, 'i32', -65536)}",
                f"  {dst}.ef = bitcast {i} {dst}.e to {f}",
                f"  {dst}.of = bitcast {i} {dst}.o to {f}"]

    def prepare_a(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        lines = [f"  {dst}.e = shl i32 {src}, 16", f"  {dst}.o = and i32 {src}, -65536",
                 f"  {dst}.es = bitcast i32 {dst}.e to float",
                 f"  {dst}.os = bitcast i32 {dst}.o to float"]
        return lines + broadcast(f"{dst}.ef", f"{dst}.es", lanes, "float") + \
            broadcast(f"{dst}.of", f"{dst}.os", lanes, "float")

    def step(self, ops: Operands, lanes: int, acc: str, a: str, b: str, dst: str) -> List[str]:
        f = vec(lanes, "float")
        fma = f"@llvm.fma.v{lanes}f32"
        return [f"  {dst}.t = call {f} {fma}({f} {a}.ef, {f} {b}.ef, {f} {acc})",
                f"  {dst} = call {f} {fma}({f} {a}.of, {f} {b}.of, {f} {dst}.t)"]


class Int8Widen(VectorRoute):
    """int8 pairs widened to int16, pair products summed into int32 lanes."""

    operands = INT8

    def __init__(self, name: str, instruction: str, isas: tuple, feature: Optional[str],
                 width: Optional[int], intrinsic: Optional[str]):
        self.name, self.instruction = name, instruction
        self.isas, self.feature, self.width, self.intrinsic = isas, feature, width, intrinsic

    def available(self, dev: DeviceModel) -> bool:
        units = dev.cpu.matrix_units if dev.cpu else ()
        return dev.isa in self.isas and (self.feature is None or self.feature in units)

    def lanes(self, dev: DeviceModel) -> int:
        return self.width // 32 if self.width else _simd_lanes(dev)

    def kgroup(self, ops: Operands) -> int:
        return 2

    def macs_per_instruction(self, ops: Operands, lanes: int) -> float:
        return lanes * 2 / 2  # the pair product and the add into the accumulator

    def b_load_type(self, ops: Operands, lanes: int) -> str:
        return vec(2 * lanes, "i8")

    def _ext(self, dtype: str) -> str:
        return "sext" if dtype == "int8" else "zext"

    def declarations(self, ops: Operands, lanes: int) -> List[str]:
        if self.intrinsic is None:
            return []
        return [f"declare {vec(lanes, 'i32')} @{self.intrinsic}({vec(2 * lanes, 'i16')}, "
                f"{vec(2 * lanes, 'i16')})"]

    def prepare_b(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        return [f"  {dst} = {self._ext(ops.b)} {vec(2 * lanes, 'i8')} {src} to "
                f"{vec(2 * lanes, 'i16')}"]

    def prepare_a(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        return [f"  {dst}.b = bitcast i16 {src} to <2 x i8>",
                f"  {dst}.h = {self._ext(ops.a)} <2 x i8> {dst}.b to <2 x i16>",
                f"  {dst}.s = bitcast <2 x i16> {dst}.h to i32"] + \
            broadcast(f"{dst}.w", f"{dst}.s", lanes, "i32") + \
            [f"  {dst} = bitcast {vec(lanes, 'i32')} {dst}.w to {vec(2 * lanes, 'i16')}"]

    def step(self, ops: Operands, lanes: int, acc: str, a: str, b: str, dst: str) -> List[str]:
        i32, i16 = vec(lanes, "i32"), vec(2 * lanes, "i16")
        if self.intrinsic is not None:
            return [f"  {dst}.p = call {i32} @{self.intrinsic}({i16} {a}, {i16} {b})",
                    f"  {dst} = add {i32} {acc}, {dst}.p"]
        w32 = vec(2 * lanes, "i32")
        even = "<" + ", ".join(f"i32 {2 * i}" for i in range(lanes)) + ">"
        odd = "<" + ", ".join(f"i32 {2 * i + 1}" for i in range(lanes)) + ">"
        return [f"  {dst}.aw = sext {i16} {a} to {w32}", f"  {dst}.bw = sext {i16} {b} to {w32}",
                f"  {dst}.m = mul {w32} {dst}.aw, {dst}.bw",
                f"  {dst}.e = shufflevector {w32} {dst}.m, {w32} poison, {vec(lanes, 'i32')} {even}",
                f"  {dst}.o = shufflevector {w32} {dst}.m, {w32} poison, {vec(lanes, 'i32')} {odd}",
                f"  {dst}.p = add {i32} {dst}.e, {dst}.o", f"  {dst} = add {i32} {acc}, {dst}.p"]


INT8_MADD_512 = Int8Widen("avx512bw_madd", "vpmaddwd zmm", ("avx512",), "avx512bw", 512,
                          "llvm.x86.avx512.pmaddw.d.512")
INT8_MADD_256 = Int8Widen("avx2_madd", "vpmaddwd ymm", ("avx512", "avx2"), None, 256,
                          "llvm.x86.avx2.pmadd.wd")
INT8_WIDEN = Int8Widen("int8_widen", "int8 → int32 multiply-add", ("neon",), None, None, None)
