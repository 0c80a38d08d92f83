"""Vectorizable float32 exp / erf / tanh / sigmoid as TIR expressions, and the rewrite that puts
them in place of TVM's calls.

LLVM lowers ``T.exp`` (and ``T.erf``, ``T.tanh``, and ``T.sigmoid`` through exp) of a float32
vector to one scalar libm call per element, so a softmax or a GELU runs at a few GB/s whatever
the schedule. The expressions here use only multiplies, adds, min / max, selects, integer shifts
and bit reinterpretation, all of which vectorize, and stay within 1e-6 relative error of the
true value wherever it is a normal float32 (tests/backends/cpu/test_vector_math.py measures it):

* exp: n = round(x·log2 e) by the 1.5·2^23 rounding trick (no float->int conversion of a
  possibly-NaN value), r = x - n·ln2 with ln2 split in two (the high part has 16 bits, so n times
  it is exact), exp(r) = 1 + r + r²·P(r) on |r| <= ln2/2 (P of degree 4, fitted for this project:
  3.5e-9 relative in exact arithmetic), times 2^n built from exponent bits as two factors
  2^(n>>1)·2^(n-(n>>1)), so results near the overflow threshold stay finite, larger ones become
  inf and tiny ones underflow gradually to subnormals and 0 (x is clamped to [-104, 88.8]).
* tanh: an odd polynomial x·(1 + x²·Q(x²)) for |x| < 0.625 (relative accuracy down to the
  smallest x; fitted minimax, 4.4e-9), 1 - 2/(exp(2|x|) + 1) with the sign of x beyond; |x| is
  clamped at 10, where tanh is 1 in float32.
* sigmoid: e = exp(-|x|) in (0, 1], 1/(1 + e) for x >= 0 and e/(1 + e) for x < 0 (no
  cancellation: relative accuracy for x << 0 too).
* erf: x·P(x²)/Q(x²), a rational fit on [0, 3.9] (beyond it erf is ±1 within 4e-8).

The builders repeat their argument rather than bind it with ``Let``: a schedule may inline a
stage into several readers (or one reader twice), and a ``Let`` variable bound twice makes the
function ill-formed for any later ``Schedule``. TVM's common-subexpression elimination and
LLVM's merge the copies again (the same instructions as with ``Let``). NaN gives NaN. Only
float32 is rewritten: float64 keeps libm's full precision, other types keep TVM's own lowering.
"""
from __future__ import annotations

import math
from typing import Callable, Dict

import tvm
import tvm_ffi
from tvm import tirx

_F32 = "float32"
_I32 = "int32"


def _f32(v: float) -> tirx.PrimExpr:
    return tirx.const(v, _F32)


def _i32(v: int) -> tirx.PrimExpr:
    return tirx.const(v, _I32)


def _float32_only(x: tirx.PrimExpr) -> None:
    """The constants and bit tricks here are float32's: another type would be computed at
    float32's precision (and a float64's exponent bits misread), so it is refused."""
    dtype = getattr(x, "dtype", None)  # a TE tensor element has one, an expression a type
    dtype = str(dtype if dtype is not None else getattr(getattr(x, "ty", None), "dtype", ""))
    if dtype != _F32:
        raise TypeError(f"vector_math builds float32 expressions, not {dtype or type(x).__name__}")


def _horner(coeffs, s: tirx.PrimExpr) -> tirx.PrimExpr:
    """sum(coeffs[k] * s**k) (ascending powers)."""
    acc = _f32(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * s + _f32(c)
    return acc


def _nan_passes(x: tirx.PrimExpr, value: tirx.PrimExpr) -> tirx.PrimExpr:
    """``value``, or x where x is NaN (the clamps may turn a NaN into a bound: TVM's min / max
    are compare-and-select). The test is on the bits: TVM's VectorizeLoop scalarizes a loop
    holding ``T.isnan``, and its simplifier folds ``x != x`` to false."""
    bits = tirx.bitwise_and(tirx.reinterpret(_I32, x), _i32(0x7FFFFFFF))
    return tirx.Select(bits > _i32(0x7F800000), x, value)


# -- exp --------------------------------------------------------------------------------------------
_LOG2E = 1.4426950408889634
_LN2 = math.log(2.0)
_LN2_HI = round(_LN2 * 2 ** 16) / 2 ** 16  # 16 significant bits: n * _LN2_HI is exact, |n| <= 150
_LN2_LO = _LN2 - _LN2_HI
# adding 1.5 * 2^23 rounds a float32 of magnitude < 2^22 to an integer held in the low mantissa
# bits: the integer is the bits of the sum minus those of 1.5 * 2^23 (read through the bits:
# TVM's simplifier folds (a + c) - c to a for floats too)
_ROUND_MAGIC = 12582912.0
_ROUND_MAGIC_BITS = 0x4B400000
# exp(r) = 1 + r + r^2 * P(r) on |r| <= 1.02 * ln2 / 2 (Lawson's weighted minimax of the
# relative error, ascending powers)
_EXP_P = (0.4999999262929014, 0.1666650871418823, 0.04166852832723537, 0.0083701350713706,
          0.00138116601000142)
# exp overflows to inf above ln(FLT_MAX) = 88.7228; below ln(2^-150) = -103.97 it rounds to 0
_EXP_HI = 88.8
_EXP_LO = -104.0


def _exp_clamped(xc: tirx.PrimExpr) -> tirx.PrimExpr:
    """exp of a finite float32 in [-104, 88.8]."""
    t = xc * _f32(_LOG2E) + _f32(_ROUND_MAGIC)
    n = tirx.reinterpret(_I32, t) - _i32(_ROUND_MAGIC_BITS)  # round(xc * log2 e)
    nf = tirx.Cast(_F32, n)
    r = (xc - nf * _f32(_LN2_HI)) - nf * _f32(_LN2_LO)
    p = _f32(1.0) + (r + r * r * _horner(_EXP_P, r))
    n1 = tirx.shift_right(n, _i32(1))  # two factors: each exponent stays in range
    s1 = tirx.reinterpret(_F32, tirx.shift_left(n1 + _i32(127), _i32(23)))
    s2 = tirx.reinterpret(_F32, tirx.shift_left(n - n1 + _i32(127), _i32(23)))
    return p * s1 * s2


def exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """exp of a float32 TIR expression (inf above 88.72, gradual underflow to 0, NaN -> NaN)."""
    _float32_only(x)
    xc = tirx.max(tirx.min(x, _f32(_EXP_HI)), _f32(_EXP_LO))
    return _nan_passes(x, _exp_clamped(xc))


# -- tanh -------------------------------------------------------------------------------------------
_TANH_SMALL = 0.625
# tanh(x) = x * (1 + x^2 * Q(x^2)) on |x| < 0.625 (weighted minimax of the relative error)
_TANH_Q = (-0.3333328194266076, 0.13331442211553612, -0.05373971597654437, 0.02063908963024212,
           -0.00570498922066676)
_TANH_CLAMP = 10.0  # tanh(10) = 1 - 4e-9: 1 in float32


def tanh(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """tanh of a float32 TIR expression (relative accuracy near 0, ±1 beyond |x| ~ 9)."""
    _float32_only(x)
    ax = tirx.abs(x)
    x2 = x * x
    small = x * (_f32(1.0) + x2 * _horner(_TANH_Q, x2))  # x * (...): keeps the sign of -0
    e = _exp_clamped(_f32(2.0) * tirx.min(ax, _f32(_TANH_CLAMP)))
    big = _f32(1.0) - _f32(2.0) / (e + _f32(1.0))
    signed = tirx.Select(x < _f32(0.0), -big, big)
    return _nan_passes(x, tirx.Select(ax < _f32(_TANH_SMALL), small, signed))


# -- sigmoid ----------------------------------------------------------------------------------------
def sigmoid(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """1 / (1 + exp(-x)) of a float32 TIR expression, relatively accurate for x << 0 too."""
    _float32_only(x)
    e = exp(-tirx.abs(x))  # NaN: e is NaN, and so is the quotient
    return tirx.Select(x < _f32(0.0), e, _f32(1.0)) / (_f32(1.0) + e)


# -- erf --------------------------------------------------------------------------------------------
# erf(x) ~= x * P(x^2) / Q(x^2), coefficients in ascending powers of x^2, fitted for this project
# by Sanathanan-Koerner iteration on [0, 3.9]: max abs error 5e-8 in float64 arithmetic. Beyond
# |x| = 3.9, |erf| is 1 to within 4e-8, so x is clamped there.
_ERF_P = (1.1283790841021166, 0.18851665812213933, 0.05256403254321045,
          0.0037028367919265033, 0.00028670997853062714, 2.107296521464837e-06)
_ERF_Q = (1.0, 0.5004008740571378, 0.11338781136018444, 0.014840141527519139,
          0.0011533761732771862, 3.8779001811390104e-05)
_ERF_CLAMP = 3.9


def erf(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """The rational erf of a float32 TIR expression."""
    _float32_only(x)
    lim = _f32(_ERF_CLAMP)
    xc = tirx.max(tirx.min(x, lim), -lim)
    s = xc * xc
    return _nan_passes(x, xc * _horner(_ERF_P, s) / _horner(_ERF_Q, s))


erf_expr = erf  # the name the Relax fast-math legalization has always used


# -- the rewrite ------------------------------------------------------------------------------------
BUILDERS: Dict[str, Callable[[tirx.PrimExpr], tirx.PrimExpr]] = {
    "tirx.exp": exp, "tirx.erf": erf, "tirx.tanh": tanh, "tirx.sigmoid": sigmoid,
}


def _rewrite_call(call):
    build = BUILDERS.get(getattr(call.op, "name", None))
    if build is None or len(call.args) != 1 or \
            str(getattr(call.ty, "dtype", "")) != _F32:
        return call
    return build(call.args[0])


def rewrite_vector_math(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every scalar float32 ``exp`` / ``erf`` / ``tanh`` / ``sigmoid`` call replaced
    by the vectorizable expressions above (the same object when it has none)."""
    return tvm_ffi.structural_map(func, (tvm.ir.expr.Call, _rewrite_call))


def vector_math_pass() -> tvm.transform.Pass:
    """:func:`rewrite_vector_math` on every PrimFunc of a module."""
    return tvm.tirx.transform.prim_func_pass(lambda f, _mod, _ctx: rewrite_vector_math(f),
                                             opt_level=0, name="RollerVectorMath")
