"""Apply a micro-kernel rTile (``policy_microkernel``) to a GEMM-like PrimFunc.

The loop nest is the tiled one (``lower``): tasks (fused, parallel) · the task's register tiles
· reduction chunks · the chunk tensorized as one call of the route's micro-kernel
(``microkernel``), the accumulator block kept per register tile and written back once with the
epilogue folded in. The axes are padded to the register tile and the chunk (``pad_einsum``,
zero-filled operands); B is copied into the route's panels ``(.., n // L, k // g, n % L, k % g)``
— at compile time when it is a constant parameter (a weight), else once per call before the
tasks — and A into panels ``(.., m // ra, k // ka, m % ra, k % ka)``, per task.
"""
from __future__ import annotations

from typing import Tuple

from tvm import s_tir, tirx

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.schedule import attempt, axis_loops, perfect_split
from tvm_roller.backends.cpu.loops import parallel_vectorize_block, vectorize_inner
from tvm_roller.backends.cpu.lower import fold_epilogue, pad_main
from tvm_roller.backends.cpu.microkernel import Candidate, Shape
from tvm_roller.backends.cpu.microkernel.intrin import intrin_name
from tvm_roller.backends.cpu.microkernel.pack import pack_intrin_name, pack_ir
from tvm_roller.backends.cpu.policy_microkernel import GemmRoles
from tvm_roller.analysis.constants import layout_free_param
from tvm_roller.backends.cpu.prepack import PREPROC
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile


def apply_microkernel(func: tirx.PrimFunc, fa: FuncAnalysis, t: RTile, roles: GemmRoles,
                      cand: Candidate) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    leftovers = list(fa.producers)  # computed whole, before the tasks (casts, quantization)
    ext_p, crops, in_pads = pad_main(sch, fa, t)
    main = sch.get_sblock(fa.main)
    loops = axis_loops(sch, main)
    s0, s1, s2, s3 = [], [], [], []
    for i in fa.spatial:
        a, b, c, d = perfect_split(sch, loops[i], ext_p[i],
                                    [t.l2[i] // t.l1[i], t.l1[i] // t.reg[i], t.reg[i]])
        s0.append(a); s1.append(b); s2.append(c); s3.append(d)
    r0, r1 = perfect_split(sch, loops[roles.k], ext_p[roles.k], [t.l1[roles.k]])
    im, i_n = fa.spatial.index(roles.m), fa.spatial.index(roles.n)
    m3, n3 = s3[im], s3[i_n]
    unit3 = [l for l in s3 if not (l.same_as(m3) or l.same_as(n3))]
    # BLIS's order in a task: column panel · reduction chunk · row tiles, so one chunk of a B
    # panel stays in L1 for every row tile of the task while the task's rows stay in L2; the
    # column panel's accumulators (the task's rows × one block of columns) live in a buffer
    # the kernel loads and stores per call
    rest1 = [l for i, l in enumerate(s1) if i not in (im, i_n)]
    sch.reorder(*(s0 + rest1 + [s1[i_n], r0, s1[im]] + s2 + unit3 + [r1, m3, n3]))
    task = sch.fuse(*s0) if len(s0) > 1 else s0[0]
    if t.num_tasks > 1:
        sch.parallel(task)

    wb = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(wb, s1[i_n], preserve_unit_loops=True)
    for name in crops:
        sch.reverse_compute_inline(sch.get_sblock(name))
    leftovers += fold_epilogue(sch, list(fa.consumers), sch.get(wb).name_hint)
    vectorize_inner(sch, sch.get_loops(wb)[-1], t.vector_lanes)

    shape = cand.shape
    b_pack, b_const, k_dim, n_dim = _pack(sch, func, main, roles.b, roles.k, roles.n,
                                          shape.b_cols, shape.kgroup)
    packed = {sch.get(b_pack).name_hint}
    if not b_const:
        _copy_tiles(sch, b_pack, shape, roles.ops.b, k_dim, n_dim, t.num_tasks)
    a_pack, a_const, _, _ = _pack(sch, func, main, roles.a, roles.k, roles.m, shape.a_rows,
                                  shape.a_k)
    packed.add(sch.get(a_pack).name_hint)
    if not a_const:  # the task's rows, once per task (cache-resident for its columns)
        sch.compute_at(a_pack, task, preserve_unit_loops=True)
        vectorize_inner(sch, sch.get_loops(a_pack)[-1], t.vector_lanes)
    leftovers = [n for n in leftovers + in_pads if n not in packed]
    init = sch.decompose_reduction(main, r0)
    vectorize_inner(sch, sch.get_loops(init)[-1], t.vector_lanes)
    intrin = intrin_name(cand.route, roles.ops, shape, t.l1[roles.k])
    if not attempt(sch.tensorize, r1, intrin):
        raise UnsupportedError(f"{fa.main} does not match the micro-kernel product "
                               f"C += {roles.ops.acc}(A) · {roles.ops.acc}(B) "
                               "(operand order or casts differ)")
    sch.annotate(task, "pragma_import_llvm", cand.route.kernel_ir(roles.ops, shape))
    remaining = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    for name in leftovers:
        if name in remaining:  # (an epilogue stage inlined forward is gone)
            parallel_vectorize_block(sch, sch.get_sblock(name), t.vector_lanes, t.num_tasks)
    return sch


def _pack(sch: s_tir.Schedule, func: tirx.PrimFunc, main, name: str, k: int, other: int,
          width: int, group: int) -> Tuple[s_tir.SBlockRV, bool, int, int]:
    """Copy operand ``name`` of ``main`` (or its zero-padded copy, inlined into the copy) into
    panels: ``(.., other // width, k // group, other % width, k % group)``; the copy's block
    and whether it is a constant parameter (then marked for folding while compiling)."""
    reads = [str(r.source.name) for r in sch.get(main).reads]
    read = name if name in reads else f"{name}_pad"
    region = sch.get(main).reads[reads.index(read)]
    k_dim, o_dim = _dims_of(sch.get(main), region, name, k, other)
    cb = sch.cache_read(main, reads.index(read), "global")
    if read != name:  # the padding copy folds into the packing copy
        sch.compute_inline(sch.get_sblock(read))
        region = sch.get(cb).reads[0]

    def layout(*idx):
        rest = [x for d, x in enumerate(idx) if d not in (k_dim, o_dim)]
        kk, oo = idx[k_dim], idx[o_dim]
        return (*rest, oo // width, kk // group, oo % width, kk % group)

    sch.transform_layout(cb, ("write", 0), layout)
    constant = layout_free_param(func, region.source) is not None
    if constant:
        sch.annotate(cb, PREPROC, True)
    return cb, constant, k_dim, o_dim


def _copy_tiles(sch: s_tir.Schedule, cb, shape: Shape, dtype: str, k_dim: int, o_dim: int,
                cores: int) -> None:
    """B's copy (made in every call) as rows of the panel layout, a few shuffles each
    (``microkernel.pack``; a zero-padded copy keeps its element loop), parallel."""
    lanes, g = shape.b_cols, shape.kgroup
    loops = sch.get_loops(cb)
    rest = [l for d, l in enumerate(loops) if d not in (k_dim, o_dim)]
    ko, ki = sch.split(loops[k_dim], [None, g])
    oo, oi = sch.split(loops[o_dim], [None, lanes])
    sch.reorder(*rest, oo, ko, oi, ki)
    k_contiguous = k_dim > o_dim
    tiled = attempt(sch.tensorize, oi, pack_intrin_name(lanes, g, dtype, k_contiguous))
    outer = sch.fuse(*rest, oo) if rest else oo
    if tiled:
        sch.annotate(outer, "pragma_import_llvm", pack_ir(lanes, g, dtype, k_contiguous))
    if cores > 1:
        sch.parallel(outer)


def _dims_of(blk, region, name: str, k: int, other: int) -> Tuple[int, int]:
    """The buffer dimensions of an operand indexed by the reduction and the other axis."""
    vs = [iv.var for iv in blk.iter_vars]

    def dims(v) -> list:
        return [d for d, r in enumerate(region.region)
                if any(u.same_as(v) for u in tirx.analysis.undefined_vars(r.min, []))]

    k_dims, o_dims = dims(vs[k]), dims(vs[other])
    if len(k_dims) != 1 or len(o_dims) != 1 or k_dims == o_dims:
        raise UnsupportedError(f"operand {name} is not indexed by one reduction and one "
                               "row / column dimension")
    return k_dims[0], o_dims[0]
