"""The micro-kernel interface: one register-level product ``C[BM, BN] += A · B`` over a
reduction chunk, as one member per instruction route (oneDNN's brgemm idea: one interface, one
implementation per ISA, picked by what the CPU has — here picked by the device model's predicted
time, ``family.candidates``).

Every member reads its operands packed once (``lower_microkernel``):

* A as panels ``Ap[m // ra, k // ka, m % ra, k % ka]`` (``ra`` rows, ``ka`` reduction elements
  side by side: what one broadcast or tile load takes);
* B as panels ``Bp[n // P, k // g, n % P, k % g]``: for each ``P`` output columns (one vector
  of accumulator lanes, or a vector route's whole block: one step's vectors side by side), the
  reduction in groups of ``g`` (what one lane's product consumes: 4 bytes for a dot-product
  instruction, 1 element for an FMA);

and is an LLVM IR function ``void f(ptr c, i64 ldc, ptr a, i64 lda, ptr b, i64 ldb, i64 steps)``
(strides in bytes: ``ldc`` between C's rows, ``lda`` / ``ldb`` from one A / B panel to the next;
``steps`` reduction steps of ``ka`` for A's panels). IR, because TVM's code generator has no
AMX tile type and its bfloat16 legalization would rewrite bf16 operands of an intrinsic call.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import List, Tuple

from tvm_roller.hardware.model import DeviceModel, dtype_bytes


@dataclass(frozen=True)
class Operands:
    """A product's operand and accumulator dtypes."""

    a: str
    b: str
    acc: str

    @property
    def elem_bytes(self) -> int:
        return dtype_bytes(self.a)

    @property
    def label(self) -> str:
        short = {"bfloat16": "bf16", "float32": "f32", "uint8": "u8", "int8": "s8"}
        return f"{short.get(self.a, self.a)}{short.get(self.b, self.b)}"


F32 = Operands("float32", "float32", "float32")
BF16 = Operands("bfloat16", "bfloat16", "float32")
U8S8 = Operands("uint8", "int8", "int32")
S8U8 = Operands("int8", "uint8", "int32")
S8S8 = Operands("int8", "int8", "int32")
U8U8 = Operands("uint8", "uint8", "int32")
INT8 = (U8S8, S8U8, S8S8, U8U8)
#: operand dtypes a micro-kernel takes (the analysis lets them into a tiled kernel)
OPERAND_DTYPES = ("bfloat16", "int8", "uint8")


@dataclass(frozen=True)
class Shape:
    """One micro-kernel call's output block, rows × columns, and its operand panels."""

    rows: int  # BM
    cols: int  # BN: a multiple of the route's lanes
    a_rows: int  # ra: rows of an A panel
    a_k: int  # ka: reduction elements of an A panel's row
    lanes: int  # L: accumulator lanes of one vector
    kgroup: int  # g: reduction elements per lane per step of a B panel
    panel: int = 0  # columns of a B panel: a block's vectors side by side (0: one vector's)

    @property
    def b_cols(self) -> int:
        """Columns of one B panel (``Bp[.., n // b_cols, k // g, n % b_cols, k % g]``)."""
        return self.panel or self.lanes

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.cols}"


class Route(ABC):
    """One instruction route (see the module docstring)."""

    name: str
    instruction: str  # what ``explain`` names
    operands: Tuple[Operands, ...]

    @abstractmethod
    def available(self, dev: DeviceModel) -> bool:
        """Whether the device's ISA has this route's instructions."""

    @abstractmethod
    def shapes(self, dev: DeviceModel, ops: Operands) -> List[Shape]:
        """The register blocks this route offers on ``dev`` (within its vector registers)."""

    @abstractmethod
    def kernel_ir(self, ops: Operands, shape: Shape) -> str:
        """The micro-kernel for ``shape`` as LLVM IR (``symbol`` its function)."""

    @abstractmethod
    def preset_gops(self, dev: DeviceModel, ops: Operands, shape: Shape) -> float:
        """One core's rate (GFLOP/s or GOP/s, 2 per multiply-add) before calibration."""

    def symbol(self, ops: Operands, shape: Shape) -> str:
        return f"tvm_roller_mk_{self.name}_{ops.label}_{shape.rows}x{shape.cols}"

    def key(self, shape: Shape) -> str:
        """The name of a measured rate in the device model (``CpuTraits.route_gops``): the
        route's instructions and block (its operand signedness does not change the rate)."""
        return f"{self.name}:{shape.label}"

    def usable(self, dev: DeviceModel, ops: Operands) -> bool:
        """Whether this route computes ``ops`` products on ``dev``."""
        return ops in self.operands and self.available(dev)
