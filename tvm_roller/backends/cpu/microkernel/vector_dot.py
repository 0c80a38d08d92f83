"""Micro-kernels of vector instructions: ``rows`` broadcast A words × ``vecs`` B vectors of
``L`` accumulator lanes, ``rows × vecs`` accumulators in registers over the whole chunk (the
BLIS / brgemm register block). A is read row by row, ``lda`` bytes apart (brgemm's broadcast
loads: an A panel is one row, ``Shape.a_rows`` 1), B from panels as wide as the block (one
step's vectors in adjacent cache lines). A member says how its B vector and A word become
operands and what one step does to an accumulator (``VectorRoute`` hooks); the loop, the loads
and the write-back are shared here.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import List

from tvm_roller.backends.cpu.microkernel.route import Operands, Route, Shape
from tvm_roller.hardware.model import DeviceModel

_MAX_ROWS = 12  # rows of a register block: beyond, the broadcasts outnumber the B loads anyway


def vec(n: int, ty: str) -> str:
    return f"<{n} x {ty}>"


def splat(n: int, ty: str, value: int) -> str:
    """A constant vector of ``n`` equal elements, in IR text."""
    return "<" + ", ".join(f"{ty} {value}" for _ in range(n)) + ">"


def broadcast(dst: str, src: str, n: int, ty: str) -> List[str]:
    """``dst`` = the scalar ``src`` in all ``n`` lanes."""
    return [f"  {dst}.i = insertelement {vec(n, ty)} poison, {ty} {src}, i64 0",
            f"  {dst} = shufflevector {vec(n, ty)} {dst}.i, {vec(n, ty)} poison, "
            f"{vec(n, 'i32')} zeroinitializer"]


class VectorRoute(Route):
    """A route of vector instructions (see the module docstring)."""

    extra_registers = 1  # vector registers besides accumulators and B vectors (A's broadcast)
    b_registers = 1  # registers one B vector takes once prepared

    @abstractmethod
    def lanes(self, dev: DeviceModel) -> int:
        """Accumulator lanes of one vector on ``dev``."""

    @abstractmethod
    def kgroup(self, ops: Operands) -> int:
        """Reduction elements one lane takes per step."""

    @abstractmethod
    def macs_per_instruction(self, ops: Operands, lanes: int) -> float:
        """Multiply-adds per vector instruction slot (what ``fma_units`` issue per cycle)."""

    @abstractmethod
    def declarations(self, ops: Operands, lanes: int) -> List[str]:
        """The intrinsics the step calls."""

    @abstractmethod
    def prepare_b(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        """IR making the operand(s) named ``dst`` of a loaded B vector ``src`` (see
        ``b_load_type``)."""

    @abstractmethod
    def prepare_a(self, ops: Operands, lanes: int, src: str, dst: str) -> List[str]:
        """IR making the operand(s) named ``dst`` of one A word ``src`` (``a_word_type``)."""

    @abstractmethod
    def step(self, ops: Operands, lanes: int, acc: str, a: str, b: str, dst: str) -> List[str]:
        """IR making ``dst``, the accumulator ``acc`` after one step over A's ``a`` and B's
        ``b`` operands."""

    def issue_share(self, dev: DeviceModel) -> float:
        """This route's instructions issued per cycle as a share of ``fma_units`` on ``dev``'s
        core (1: as many as FMAs)."""
        return 1.0

    def acc_type(self, ops: Operands) -> str:
        return "float" if ops.acc == "float32" else "i32"

    def b_load_type(self, ops: Operands, lanes: int) -> str:
        """The IR type one B step is loaded as (``lanes`` groups of ``kgroup`` elements)."""
        return vec(lanes, "i32")

    def a_word_type(self, ops: Operands) -> str:
        return {4: "i32", 2: "i16", 1: "i8"}[self.kgroup(ops) * ops.elem_bytes]

    # -- the shared parts ---------------------------------------------------------------------
    def shapes(self, dev: DeviceModel, ops: Operands) -> List[Shape]:
        lanes, g = self.lanes(dev), self.kgroup(ops)
        out = []
        for vecs in range(1, 5):
            free = dev.num_vector_registers - self.extra_registers - self.b_registers * vecs
            most = min(_MAX_ROWS, free // vecs)
            # the fullest block, and short ones for few rows (a one-row block's unit loop does
            # not tensorize: one row is padded to 2)
            for rows in sorted({r for r in (2, 4, 8, most) if 2 <= r <= most}):
                # A read in place, row by row (``lda`` apart): one broadcast word per row
                # and B as panels of the block's width: one step's vectors in adjacent lines
                out.append(Shape(rows, vecs * lanes, 1, g, lanes, g, vecs * lanes))
        return out

    def preset_gops(self, dev: DeviceModel, ops: Operands, shape: Shape) -> float:
        """Issue-bound: ``fma_units`` instructions a cycle, unless the block has too few
        independent accumulators to hide the latency or its loads outnumber the ports."""
        traits = dev.cpu
        vecs = shape.cols // shape.lanes
        chains = shape.rows * vecs
        macs = self.macs_per_instruction(ops, shape.lanes) * self.issue_share(dev)
        cycles = max(chains / traits.fma_units, (shape.rows + vecs) / traits.loads_per_cycle,
                     traits.fma_chains / traits.fma_units)
        per_cycle = chains * macs * 2 / cycles
        return per_cycle * dev.frequency_ghz

    def kernel_ir(self, ops: Operands, shape: Shape) -> str:
        lanes, g, eb = shape.lanes, shape.kgroup, ops.elem_bytes
        rows, vecs = shape.rows, shape.cols // shape.lanes
        acc_t = vec(lanes, self.acc_type(ops))
        b_t, w_t = self.b_load_type(ops, lanes), self.a_word_type(ops)
        lines = self.declarations(ops, lanes) + [
            f"define linkonce_odr void @{self.symbol(ops, shape)}(ptr %c, i64 %ldc, ptr %a, "
            "i64 %lda, ptr %b, i64 %ldb, i64 %steps) {", "entry:"]
        for r in range(rows):
            lines += [f"  %co{r} = mul i64 %ldc, {r}", f"  %cr{r} = getelementptr i8, ptr %c, i64 %co{r}"]
            for v in range(vecs):
                lines += [f"  %cp{r}_{v} = getelementptr i8, ptr %cr{r}, i64 {v * lanes * 4}",
                          f"  %c0_{r}_{v} = load {acc_t}, ptr %cp{r}_{v}, align 4"]
        for v in range(vecs):  # one block-wide panel (``shapes``): a step's vectors side by side
            lines.append(f"  %bb{v} = getelementptr i8, ptr %b, i64 {v * lanes * g * eb}")
        lines += ["  br label %loop", "loop:", "  %s = phi i64 [0, %entry], [%s1, %loop]"]
        lines += [f"  %acc{r}_{v} = phi {acc_t} [%c0_{r}_{v}, %entry], [%n{r}_{v}, %loop]"
                  for r in range(rows) for v in range(vecs)]
        lines += [f"  %aoff = mul i64 %s, {g * eb}", f"  %boff = mul i64 %s, {shape.cols * g * eb}",
                  "  %ab = getelementptr i8, ptr %a, i64 %aoff"]
        for v in range(vecs):
            lines += [f"  %bp{v} = getelementptr i8, ptr %bb{v}, i64 %boff",
                      f"  %bv{v} = load {b_t}, ptr %bp{v}, align 1"]
            lines += self.prepare_b(ops, lanes, f"%bv{v}", f"%bx{v}")
        for r in range(rows):
            lines += [f"  %ar{r} = mul i64 %lda, {r}",
                      f"  %ap{r} = getelementptr i8, ptr %ab, i64 %ar{r}",
                      f"  %w{r} = load {w_t}, ptr %ap{r}, align 1"]
            lines += self.prepare_a(ops, lanes, f"%w{r}", f"%ax{r}")
            for v in range(vecs):
                lines += self.step(ops, lanes, f"%acc{r}_{v}", f"%ax{r}", f"%bx{v}", f"%n{r}_{v}")
        lines += ["  %s1 = add i64 %s, 1", "  %more = icmp ult i64 %s1, %steps",
                  "  br i1 %more, label %loop, label %done", "done:"]
        lines += [f"  store {acc_t} %n{r}_{v}, ptr %cp{r}_{v}, align 4"
                  for r in range(rows) for v in range(vecs)]
        return "\n".join(lines + ["  ret void", "}"]) + "\n"
