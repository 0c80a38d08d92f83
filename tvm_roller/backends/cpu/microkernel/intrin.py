"""A route's micro-kernel as a TVM tensor intrinsic over one reduction chunk of ``kc``: the
description is ``C[BM, BN] += acc(A) · acc(B)`` over the packed panels (``route``), the
implementation one call of the route's IR function."""
from __future__ import annotations

from typing import Dict, Tuple

from tvm import s_tir
from tvm.script import tirx as T

from tvm_roller.backends.cpu.microkernel.pack import storage
from tvm_roller.backends.cpu.microkernel.route import Operands, Route, Shape

_REGISTERED: Dict[Tuple[str, Operands, Shape, int], str] = {}


def intrin_name(route: Route, ops: Operands, shape: Shape, kc: int) -> str:
    """The registered tensor intrinsic of ``route``'s kernel for ``shape`` over ``kc``."""
    key = (route.name, ops, shape, kc)
    if key not in _REGISTERED:
        name = f"{route.symbol(ops, shape)}_k{kc}"
        s_tir.TensorIntrin.register(name, *_desc_impl(route, ops, shape, kc), override=True)
        _REGISTERED[key] = name
    return _REGISTERED[key]


def _desc_impl(route: Route, ops: Operands, shape: Shape, kc: int):
    bm, bn, ra, ka, lanes, g = (shape.rows, shape.cols, shape.a_rows, shape.a_k, shape.b_cols,
                                shape.kgroup)
    acc, a_dt, b_dt = ops.acc, ops.a, ops.b
    a_st, b_st, esz = storage(a_dt), storage(b_dt), ops.elem_bytes
    a_shape, b_shape = (bm // ra, kc // ka, ra, ka), (bn // lanes, kc // g, lanes, g)
    steps, sym = kc // ka, route.symbol(ops, shape)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, a_shape, a_dt, strides=[sa, ra * ka, ka, 1], offset_factor=1)
        B = T.match_buffer(b, b_shape, b_dt, strides=[sb, lanes * g, g, 1], offset_factor=1)
        C = T.match_buffer(c, (bm, bn), acc, strides=[sc, 1], offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:bm, 0:bn], A[0:a_shape[0], 0:a_shape[1], 0:ra, 0:ka],
                    B[0:b_shape[0], 0:b_shape[1], 0:lanes, 0:g])
            T.writes(C[0:bm, 0:bn])
            for k, m, n in T.grid(kc, bm, bn):
                with T.sblock("update"):
                    vm, vn, vk = T.axis.remap("SSR", [m, n, k])
                    C[vm, vn] = C[vm, vn] + T.Cast(acc, A[vm // ra, vk // ka, vm % ra, vk % ka]) \
                        * T.Cast(acc, B[vn // lanes, vk // g, vn % lanes, vk % g])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, a_shape, a_dt, strides=[sa, ra * ka, ka, 1], offset_factor=1)
        B = T.match_buffer(b, b_shape, b_dt, strides=[sb, lanes * g, g, 1], offset_factor=1)
        C = T.match_buffer(c, (bm, bn), acc, strides=[sc, 1], offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:bm, 0:bn], A[0:a_shape[0], 0:a_shape[1], 0:ra, 0:ka],
                    B[0:b_shape[0], 0:b_shape[1], 0:lanes, 0:g])
            T.writes(C[0:bm, 0:bn])
            As = T.decl_buffer(a_shape, a_st, data=A.data, strides=[sa, ra * ka, ka, 1],
                               elem_offset=A.elem_offset)
            Bs = T.decl_buffer(b_shape, b_st, data=B.data, strides=[sb, lanes * g, g, 1],
                               elem_offset=B.elem_offset)
            T.evaluate(T.call_extern("void", sym, C.access_ptr("rw"), T.Cast("int64", sc) * 4,
                                     As.access_ptr("r"), T.Cast("int64", sa) * esz,
                                     Bs.access_ptr("r"), T.Cast("int64", sb) * esz,
                                     T.int64(steps)))

    return desc, impl
