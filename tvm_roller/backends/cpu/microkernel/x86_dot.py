"""x86 dot-product routes: AVX512-BF16 ``vdpbf16ps`` (bf16 pairs into fp32 lanes) and
``vpdpbusd`` (unsigned × signed byte quads into int32 lanes) in its AVX512-VNNI (zmm) and
AVX-VNNI (ymm, VEX) encodings."""
from __future__ import annotations

from typing import List

from tvm_roller.backends.cpu.microkernel.route import BF16, S8U8, U8S8, Operands
from tvm_roller.backends.cpu.microkernel.vector_dot import VectorRoute, broadcast, vec
from tvm_roller.hardware.model import DeviceModel


def _features(dev: DeviceModel) -> tuple:
    return dev.cpu.matrix_units if dev.cpu else ()


class _DotRoute(VectorRoute):
    """A 4-byte-group dot product into ``width``-bit accumulators (``feature`` required)."""

    feature: str
    width: int  # bits of the vector the instruction works on
    elem: str  # the IR element the intrinsic takes its operands as
    elem_bits: int
    intrinsic: str

    def available(self, dev: DeviceModel) -> bool:
        return dev.isa in ("avx512", "avx2") and self.feature in _features(dev)

    def lanes(self, dev: DeviceModel) -> int:
        return self.width // 32

    def kgroup(self, ops: Operands) -> int:
        return 4 // ops.elem_bytes

    def macs_per_instruction(self, ops: Operands, lanes: int) -> float:
        return lanes * self.kgroup(ops)

    def _operand_type(self, lanes: int) -> str:
        return vec(lanes * 32 // self.elem_bits, self.elem)

    def declarations(self, ops: Operands, lanes: int) -> List[str]:
        t = self._operand_type(lanes)
        acc = vec(lanes, self.acc_type(ops))
        return [f"declare {acc} @{self.intrinsic}({acc}, {t}, {t})"]

    def prepare_b(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        return [f"  {dst} = bitcast {vec(lanes, 'i32')} {src} to {self._operand_type(lanes)}"]

    def prepare_a(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        return broadcast(f"{dst}.w", src, lanes, "i32") + [
            f"  {dst} = bitcast {vec(lanes, 'i32')} {dst}.w to {self._operand_type(lanes)}"]

    def step(self, ops: Operands, lanes: int, acc: str, a: str, b: str, dst: str) -> List[str]:
        t, acc_t = self._operand_type(lanes), vec(lanes, self.acc_type(ops))
        # vpdpbusd multiplies its first operand's bytes as unsigned: the uint8 side goes first
        first, second = (b, a) if ops == S8U8 else (a, b)
        return [f"  {dst} = call {acc_t} @{self.intrinsic}({acc_t} {acc}, {t} {first}, "
                f"{t} {second})"]


#: Intel cores whose ``vdpbf16ps`` issues at a quarter of the FMA rate (half the fp32 MAC rate,
#: measured on an Emerald Rapids: 121 GFLOP/s per core against 211 for fp32 FMAs); AMD's Zen 4
#: and Zen 5 issue it as an FMA (twice the fp32 MAC rate)
_SLOW_BF16_DOT = ("cooperlake", "sapphirerapids", "emeraldrapids", "graniterapids",
                  "diamondrapids")


class Bf16Dot512(_DotRoute):
    name, instruction, operands = "avx512bf16", "vdpbf16ps zmm", (BF16,)
    feature, width, elem, elem_bits = "avx512bf16", 512, "bfloat", 16
    intrinsic = "llvm.x86.avx512bf16.dpbf16ps.512"

    def issue_share(self, dev: DeviceModel) -> float:
        return 0.25 if dev.cpu is not None and dev.cpu.core in _SLOW_BF16_DOT else 1.0


class Vnni512(_DotRoute):
    name, instruction, operands = "avx512vnni", "vpdpbusd zmm", (U8S8, S8U8)
    feature, width, elem, elem_bits = "avx512vnni", 512, "i8", 8
    intrinsic = "llvm.x86.avx512.vpdpbusd.512"


class AvxVnni256(_DotRoute):
    name, instruction, operands = "avxvnni", "{vex} vpdpbusd ymm", (U8S8, S8U8)
    feature, width, elem, elem_bits = "avxvnni", 256, "i8", 8
    intrinsic = "llvm.x86.avx512.vpdpbusd.256"
