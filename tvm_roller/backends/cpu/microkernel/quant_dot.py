"""The "4-byte dot per int32 lane" routes the quantized linear layer (``quant_linear``) is built
from: ``acc + Σ_4 w_bytes · x_bytes`` in every int32 lane, the weights' four bytes per lane and
one activation word (four int8 codes) broadcast to every lane. One route per instruction
family, picked by what the target has (``pick_quant_route``):

* ``avx512vnni``: ``vpdpbusd`` zmm (unsigned weight bytes × signed activation bytes), 16 lanes;
* ``avxvnni``: ``{vex} vpdpbusd`` ymm (Alder Lake, Sapphire Rapids), 8 lanes;
* ``avx512bw`` / ``avx2``: ``vpmaddubsw`` (byte pairs into int16) then ``vpmaddwd`` by ones
  (int16 pairs into int32), zmm / ymm. ``vpmaddubsw`` saturates at int16, and an unsigned int8
  code (≤ 255) times an activation (≤ 127), twice, can exceed it: int8 weights enter as signed
  bytes ``q = u − 128`` (``u XOR 0x80``) and the product is ``|q| · (x · sign q)`` (llama.cpp's
  trick; ≤ 2 · 127 · 127). int4 codes (≤ 15) cannot saturate and enter as they are;
* ``neon_dot``: AArch64 ``sdot`` (signed × signed), 4 lanes: int8 weights as signed bytes, int4
  codes (0..15) are valid signed bytes already;
* ``generic``: plain TIR — each byte extracted by shifts, widened and multiplied in int32 lanes
  (AArch64 without the dot-product extension); lanes from the target's vector width.

A route that takes int8 weights as signed bytes removes the codes' offset before the dot, so
the kernel's per-group correction (``offset · Σ x_q``) is 0 for it (``QuantDotRoute.offset``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Tuple, Union

import tvm
from tvm import tirx
from tvm.script import tirx as T
from tvm.target import codegen

from tvm_roller.backends.cpu.quant_format import ROWS, QuantFormat
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware.cpu import arch_of, host_triple

X86, AARCH64 = "x86_64", "aarch64"


@dataclass(frozen=True)
class QuantDotRoute:
    """One way to compute ``acc + Σ_4 w_bytes · x_bytes`` per int32 lane (module docstring)."""

    name: str
    arch: str  # the LLVM triple's architecture
    features: Tuple[str, ...]  # LLVM features the instructions need
    lanes: int  # int32 lanes per vector
    weight_signed: bool  # int8 weights enter as signed bytes (u XOR 0x80)
    op: str  # how the dot is built: a key of _BUILDERS
    intrinsics: Tuple[str, ...] = ()
    instruction: str = ""  # what an error message names

    def flips(self, fmt: QuantFormat) -> bool:
        """Whether ``fmt``'s weight words are XORed with 0x80 per byte before the dot (int8
        codes become signed bytes ``u − 128``)."""
        return self.weight_signed and fmt.bits == 8

    def offset(self, fmt: QuantFormat) -> int:
        """The per-group correction factor: the codes' offset still in the dot's weight bytes."""
        return 0 if self.flips(fmt) else fmt.offset

    def dot(self, acc: tirx.PrimExpr, w: tirx.PrimExpr, x: tirx.PrimExpr,
            signed_weights: bool) -> tirx.PrimExpr:
        """``acc + Σ_4 w_bytes · x_bytes`` per lane: ``acc``, ``w`` and ``x`` int32 vectors of
        ``lanes`` (``x`` one activation word broadcast), ``w``'s bytes signed when
        ``signed_weights`` (else unsigned), ``x``'s signed."""
        return _BUILDERS[self.op](self, acc, w, x, signed_weights)


def _bytes(v: tirx.PrimExpr, lanes: int) -> tirx.PrimExpr:
    return T.reinterpret(f"int8x{lanes * 4}", v)


def _vpdpbusd(route: QuantDotRoute, acc, w, x, signed_weights: bool) -> tirx.PrimExpr:
    if signed_weights:
        raise ValueError(f"{route.name}: vpdpbusd takes the weights as unsigned bytes")
    # (LLVM 22's signature takes the bytes as <4·lanes x i8>)
    return T.call_llvm_pure_intrin(f"int32x{route.lanes}", route.intrinsics[0], acc,
                                   _bytes(w, route.lanes), _bytes(x, route.lanes))


def _maddubs(route: QuantDotRoute, acc, w, x, signed_weights: bool) -> tirx.PrimExpr:
    lanes = route.lanes
    wb, xb = _bytes(w, lanes), _bytes(x, lanes)
    if signed_weights:
        # |q| · (x · sign q): the unsigned side stays ≤ 127, so no int16 pair sum saturates
        if len(route.intrinsics) > 2:  # vpsignb (AVX2)
            xb = T.call_llvm_pure_intrin(f"int8x{4 * lanes}", route.intrinsics[2], xb, wb)
        else:  # AVX-512BW has no vpsignb: negate x where q < 0 (a masked subtract)
            zero = T.Broadcast(T.int8(0), 4 * lanes)
            xb = T.Select(wb < zero, zero - xb, xb)
        wb = T.abs(wb)
    pairs = T.call_llvm_pure_intrin(f"int16x{2 * lanes}", route.intrinsics[0], wb, xb)
    return acc + T.call_llvm_pure_intrin(f"int32x{lanes}", route.intrinsics[1], pairs,
                                         T.Broadcast(T.int16(1), 2 * lanes))


def _sdot(route: QuantDotRoute, acc, w, x, signed_weights: bool) -> tirx.PrimExpr:
    # signed × signed: flipped int8 weights are signed bytes, int4 codes (0..15) are too
    return T.call_llvm_pure_intrin(f"int32x{route.lanes}", route.intrinsics[0], acc,
                                   _bytes(w, route.lanes), _bytes(x, route.lanes))


def _widen(route: QuantDotRoute, acc, w, x, signed_weights: bool) -> tirx.PrimExpr:
    lanes = route.lanes

    def c(v: int) -> tirx.PrimExpr:
        return T.Broadcast(T.int32(v), lanes)

    def signed_byte(v, b: int) -> tirx.PrimExpr:  # shift the byte to the top, back arithmetically
        return T.shift_right(T.shift_left(v, c(24 - 8 * b)), c(24))

    out = acc
    for b in range(4):
        wb = signed_byte(w, b) if signed_weights else T.shift_right(w, c(8 * b)) & c(0xFF)
        out = out + wb * signed_byte(x, b)
    return out


_BUILDERS = {"vpdpbusd": _vpdpbusd, "maddubs": _maddubs, "sdot": _sdot, "widen": _widen}

AVX512VNNI = QuantDotRoute("avx512vnni", X86, ("avx512vnni",), 16, False, "vpdpbusd",
                           ("llvm.x86.avx512.vpdpbusd.512",), "vpdpbusd zmm")
AVXVNNI = QuantDotRoute("avxvnni", X86, ("avxvnni",), 8, False, "vpdpbusd",
                        ("llvm.x86.avx512.vpdpbusd.256",), "{vex} vpdpbusd ymm")
AVX512BW = QuantDotRoute("avx512bw", X86, ("avx512bw",), 16, True, "maddubs",
                         ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
                         "vpmaddubsw + vpmaddwd zmm")
AVX2 = QuantDotRoute("avx2", X86, ("avx2",), 8, True, "maddubs",
                     ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd",
                      "llvm.x86.avx2.psign.b"), "vpmaddubsw + vpmaddwd ymm")
NEON_DOT = QuantDotRoute("neon_dot", AARCH64, ("dotprod",), 4, True, "sdot",
                         ("llvm.aarch64.neon.sdot.v4i32.v16i8",), "sdot")
# lanes set from the target's vector width by pick_quant_route
GENERIC = QuantDotRoute("generic", AARCH64, ("neon",), 4, False, "widen", (),
                        "int32 multiply-add")

#: best first, per architecture
ROUTES = (AVX512VNNI, AVXVNNI, AVX512BW, AVX2, NEON_DOT, GENERIC)


def _has(target: tvm.target.Target, features: Tuple[str, ...]) -> bool:
    return all(bool(codegen.target_has_features(f, target)) for f in features)


def pick_quant_route(target: Union[tvm.target.Target, dict, str]) -> QuantDotRoute:
    """The best route ``target`` has; an ``UnsupportedError`` naming what is missing when
    none (not an LLVM CPU target, an x86 CPU without AVX2, an architecture without one)."""
    if not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    if str(target.kind) != "llvm":
        raise UnsupportedError(f"the integer dot-product routes are CPU (llvm) code; target "
                               f"kind is {target.kind}")
    arch = arch_of(str(target.attrs.get("mtriple") or host_triple()))
    mine = [r for r in ROUTES if r.arch == arch]
    for route in mine:
        if _has(target, route.features):
            if route.op == "widen":  # as many lanes as the target's vectors hold
                width = int(codegen.llvm_get_vector_width(target))
                lanes = max(4, min(ROWS, width // 32))  # (a power of two: divides ROWS)
                return dataclasses.replace(route, lanes=lanes)
            return route
    if not mine:
        raise UnsupportedError(f"no integer dot-product route for architecture {arch} "
                               f"(routes exist for {X86} and {AARCH64})")
    need = ", ".join(f"{r.instruction} (+{'+'.join(r.features)})" for r in mine)
    cpu = target.attrs.get("mcpu") or "generic"
    raise UnsupportedError(f"the integer dot product needs one of {need}; target {arch} "
                           f"mcpu={cpu} has none of them")
