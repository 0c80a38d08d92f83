"""Apply an AMX rTile (``policy_amx``) to a GEMM-like PrimFunc.

The loop nest is the tiled one (``lower``): tasks (fused, parallel) · the task's register tiles
· reduction chunks · the chunk tensorized as one call of the AMX micro-kernel (``amx``), the
32×32 accumulator kept per register tile and written back once with the epilogue folded in.
The axes are padded to the register tile and the chunk (``pad_einsum``, zero-filled operands);
B is copied into the instruction's layout ``(.., n // 16, k // g, n % 16, k % g)`` — at compile
time when it is a constant parameter (a weight), else once per call before the tasks.
"""
from __future__ import annotations

from tvm import s_tir, tirx

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.schedule import attempt, axis_loops, perfect_split
from tvm_roller.backends.cpu import amx
from tvm_roller.backends.cpu.loops import parallel_vectorize_block, vectorize_inner
from tvm_roller.backends.cpu.lower import fold_epilogue, pad_main
from tvm_roller.backends.cpu.policy_amx import GemmRoles
from tvm_roller.backends.cpu.prepack import PREPROC, layout_free_param
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile


def apply_amx(func: tirx.PrimFunc, fa: FuncAnalysis, t: RTile, roles: GemmRoles) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    leftovers = list(fa.producers)  # computed whole, before the tasks (casts, quantization)
    ext_p, out_pad, in_pads = pad_main(sch, fa, t)
    main = sch.get_sblock(fa.main)
    loops = axis_loops(sch, main)
    s0, s1, s2, s3 = [], [], [], []
    for i in fa.spatial:
        a, b, c, d = perfect_split(sch, loops[i], ext_p[i],
                                    [t.l2[i] // t.l1[i], t.l1[i] // t.reg[i], t.reg[i]])
        s0.append(a); s1.append(b); s2.append(c); s3.append(d)
    r0, r1 = perfect_split(sch, loops[roles.k], ext_p[roles.k], [t.l1[roles.k]])
    m3, n3 = s3[fa.spatial.index(roles.m)], s3[fa.spatial.index(roles.n)]
    unit3 = [l for l in s3 if not (l.same_as(m3) or l.same_as(n3))]
    sch.reorder(*(s0 + s1 + s2 + unit3 + [r0, r1, m3, n3]))
    task = sch.fuse(*s0) if len(s0) > 1 else s0[0]
    if t.num_tasks > 1:
        sch.parallel(task)

    wb = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(wb, s2[-1], preserve_unit_loops=True)
    if out_pad:
        sch.reverse_compute_inline(sch.get_sblock(out_pad))
    leftovers += fold_epilogue(sch, list(fa.consumers), sch.get(wb).name_hint)
    vectorize_inner(sch, sch.get_loops(wb)[-1], t.vector_lanes)

    packed = _pack_b(sch, func, main, roles)
    leftovers = [n for n in leftovers + in_pads if n != packed]
    init = sch.decompose_reduction(main, r0)
    vectorize_inner(sch, sch.get_loops(init)[-1], t.vector_lanes)
    intrin = amx.intrin_name(roles.kind, t.l1[roles.k])
    if not attempt(sch.tensorize, r1, intrin):
        raise UnsupportedError(f"{fa.main} does not match the AMX product "
                               f"C += {roles.kind.acc_dtype}(A) · {roles.kind.acc_dtype}(B) "
                               "(operand order or casts differ)")
    sch.annotate(task, "pragma_import_llvm", amx.kernel_ir(roles.kind))
    for name in leftovers:
        if name in {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}:
            parallel_vectorize_block(sch, sch.get_sblock(name), t.vector_lanes, t.num_tasks)
    return sch


def _pack_b(sch: s_tir.Schedule, func: tirx.PrimFunc, main, roles: GemmRoles) -> str:
    """Copy B (or its zero-padded copy, inlined into the copy) into the instruction's layout;
    the copy's block name. Marked for compile-time folding when B is a constant parameter."""
    g = roles.kind.kgroup
    reads = [str(r.source.name) for r in sch.get(main).reads]
    name = roles.b if roles.b in reads else f"{roles.b}_pad"
    region = sch.get(main).reads[reads.index(name)]
    k_dim, n_dim = _dims_of(sch.get(main), region, roles)
    cb = sch.cache_read(main, reads.index(name), "global")
    if name != roles.b:  # the padding copy folds into the packing copy
        sch.compute_inline(sch.get_sblock(name))
        region = sch.get(cb).reads[0]

    def layout(*idx):
        rest = [x for d, x in enumerate(idx) if d not in (k_dim, n_dim)]
        k, n = idx[k_dim], idx[n_dim]
        return (*rest, n // 16, k // g, n % 16, k % g)

    sch.transform_layout(cb, ("write", 0), layout)
    if layout_free_param(func, region.source) is not None:
        sch.annotate(cb, PREPROC, True)
    return sch.get(cb).name_hint


def _dims_of(blk, region, roles: GemmRoles):
    """The buffer dimensions of B indexed by the reduction and the column axis."""
    vs = [iv.var for iv in blk.iter_vars]
    k_var, n_var = vs[roles.k], vs[roles.n]

    def uses(r, v) -> bool:
        return any(u.same_as(v) for u in tirx.analysis.undefined_vars(r.min, []))

    k_dims = [d for d, r in enumerate(region.region) if uses(r, k_var)]
    n_dims = [d for d, r in enumerate(region.region) if uses(r, n_var)]
    if len(k_dims) != 1 or len(n_dims) != 1 or k_dims == n_dims:
        raise UnsupportedError(f"operand {roles.b} is not indexed by one reduction and one "
                               "column dimension")
    return k_dims[0], n_dims[0]
