"""AArch64 dot-product routes: ``sdot`` / ``udot`` (+dotprod: signed × signed, unsigned ×
unsigned byte quads into int32 lanes) and ``usdot`` (+i8mm: unsigned × signed) on 128-bit NEON
vectors."""
from __future__ import annotations

from typing import List

from tvm_roller.backends.cpu.microkernel.route import S8S8, S8U8, U8S8, U8U8, Operands
from tvm_roller.backends.cpu.microkernel.vector_dot import VectorRoute, broadcast
from tvm_roller.hardware.model import DeviceModel

_I32, _I8 = "<4 x i32>", "<16 x i8>"


class NeonDot(VectorRoute):
    """``instruction`` over 4 lanes; ``feature`` (an LLVM feature) required."""

    def __init__(self, name: str, instruction: str, feature: str, operands: tuple):
        self.name, self.instruction, self.feature, self.operands = \
            name, instruction, feature, operands

    def available(self, dev: DeviceModel) -> bool:
        return dev.isa == "neon" and self.feature in (dev.cpu.matrix_units if dev.cpu else ())

    def lanes(self, dev: DeviceModel) -> int:
        return 4

    def kgroup(self, ops: Operands) -> int:
        return 4

    def macs_per_instruction(self, ops: Operands, lanes: int) -> float:
        return lanes * 4

    def _intrinsic(self) -> str:
        return f"llvm.aarch64.neon.{self.instruction}.v4i32.v16i8"

    def declarations(self, ops: Operands, lanes: int) -> List[str]:
        return [f"declare {_I32} @{self._intrinsic()}({_I32}, {_I8}, {_I8})"]

    def prepare_b(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        return [f"  {dst} = bitcast {_I32} {src} to {_I8}"]

    def prepare_a(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        return broadcast(f"{dst}.w", src, 4, "i32") + [f"  {dst} = bitcast {_I32} {dst}.w to {_I8}"]

    def step(self, ops: Operands, lanes: int, acc: str, a: str, b: str, dst: str) -> List[str]:
        first, second = (b, a) if ops == S8U8 else (a, b)  # usdot: the unsigned side first
        return [f"  {dst} = call {_I32} @{self._intrinsic()}({_I32} {acc}, {_I8} {first}, "
                f"{_I8} {second})"]


SDOT = NeonDot("neon_sdot", "sdot", "dotprod", (S8S8,))
UDOT = NeonDot("neon_udot", "udot", "dotprod", (U8U8,))
USDOT = NeonDot("neon_usdot", "usdot", "i8mm", (U8S8, S8U8))
