"""PrimFunc → the facts the policy needs: blocks, the main block, its axes and its accesses.

Works on what ``te.create_prim_func`` (or TVMScript with ``s_tir=True``) produces: a root block
whose children are one block per stage. Reads TVM's own block signatures (``T.reads``/``T.writes``,
which TVM's region analysis filled in) instead of per-operator formulas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad  # what tirx.BufferLoad(...) builds in TVM 0.27
from tvm.tirx.buffer import BufferType

from tvm_roller.analysis.access import Access, build_access
from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.inputs import unwrap_func

# Compute-bound (tiled, FMA) kernels need a float type; memory-bound kernels only move and compare
# values, so masks and indices (bool / integer tensors, as Relax's attention masks) are fine there.
# The CUDA backend adds float16 (tensor cores for compute-bound kernels).
SUPPORTED_DTYPES = ("float32", "float64")
_INT_DTYPES = ("bool", "int8", "uint8", "int16", "int32", "int64")
_SPATIAL, _REDUCE = 0, 2  # tirx.IterVar.DataPar / CommReduce


@dataclass
class Axis:
    """One iteration variable of the main block."""

    name: str
    extent: int
    kind: str  # "S" spatial or "R" reduction


@dataclass
class BlockInfo:
    name: str
    axes: List[Axis]
    reads: List[str]  # buffer names
    writes: List[str]
    is_reduction: bool
    injective: bool  # every read index is an affine/const function of spatial vars, no reduction


@dataclass
class FuncAnalysis:
    """Everything later stages read about a PrimFunc; plain data except ``func``."""

    func: tirx.PrimFunc
    blocks: List[BlockInfo]
    main: Optional[str]  # name of the anchor (heaviest reduction) block; None if none
    axes: List[Axis]  # of the main block (or of the output block when there is no reduction)
    reads: List[Access] = field(default_factory=list)
    writes: List[Access] = field(default_factory=list)
    dtype: str = "float32"
    flops: float = 0.0  # of the main block, 2 per multiply-add
    vector_axis: Optional[int] = None  # index into ``axes``: contiguous in output and inputs
    kind: str = "tiled"  # "tiled" (reuse-heavy), "reduction" (rows reduced), "elementwise"
    producers: List[str] = field(default_factory=list)  # blocks feeding the main block
    consumers: List[str] = field(default_factory=list)  # blocks after the main block
    # axes whose extent is a bucket's value of a shape variable (``planner.buckets``): the
    # kernel is replayed on the symbolic function, and pads these axes to its task tile; and
    # each one's extent at the bucket's smallest value (what the padding must not waste)
    dynamic_axes: Tuple[int, ...] = ()
    dynamic_low: Tuple[int, ...] = ()

    @property
    def spatial(self) -> List[int]:
        return [i for i, a in enumerate(self.axes) if a.kind == "S"]

    @property
    def reduction(self) -> List[int]:
        return [i for i, a in enumerate(self.axes) if a.kind == "R"]

    def footprint(self, tile: Tuple[int, ...]) -> Dict[str, int]:
        """Elements of each buffer touched by one tile (extent per axis) of the main block."""
        out: Dict[str, int] = {}
        for acc in self.reads + self.writes:
            out[acc.buffer] = max(out.get(acc.buffer, 0), acc.footprint(tile))
        return out


def _as_int(e, what: str) -> int:
    if isinstance(e, int):
        return e
    if isinstance(e, tirx.IntImm):
        return int(e.value)
    raise UnsupportedError(f"symbolic shape: {what} is {e} (roller needs static shapes)")


class _IndexChecker:
    """Rejects indices roller can't reason about: data-dependent ones and non-constant division."""

    def __init__(self) -> None:
        self.error: Optional[str] = None
        self.gather: Optional[str] = None  # a data-dependent index (set instead of error)

    def visit(self, stmt) -> None:
        def fvisit(node):
            if self.error is not None:
                return
            if isinstance(node, (TensorLoad, tirx.BufferStore)):
                for idx in node.indices:
                    self._check_index(idx, _buffer_name(node))

        post_order_visit(stmt, fvisit)

    def _check_index(self, idx, buf: str) -> None:
        def fidx(node):
            if self.error is not None:
                return
            if isinstance(node, TensorLoad):
                self.gather = self.gather or (
                    f"data-dependent index: {buf} is indexed through the values of "
                    f"{_buffer_name(node)} (a gather)")
            elif isinstance(node, (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)):
                if not isinstance(node.b, tirx.IntImm):
                    self.error = f"non-constant division in an index of {buf}: {node}"

        post_order_visit(idx, fidx)


def _buffer_name(node) -> str:
    buf = node.buffer if isinstance(node, tirx.BufferStore) else node.source
    return str(getattr(buf, "name", buf))


def analyze(func, tiled_dtypes: Sequence[str] = SUPPORTED_DTYPES,
            operand_dtypes: Sequence[str] = ()) -> FuncAnalysis:
    """Analyse ``func`` (a PrimFunc or an IRModule holding one); raise UnsupportedError if
    unfit. ``tiled_dtypes``: the float dtypes the backend's compute-bound kernels take (each
    backend passes its own); streaming kernels take them and the integer and bool types too.
    ``operand_dtypes``: low-precision dtypes (bf16, int8) its compute-bound kernels take as
    operands, accumulating in a tiled dtype or int32; streaming kernels take them too."""
    func = unwrap_func(func)
    tiled_dtypes = tuple(tiled_dtypes)
    operand_dtypes = tuple(operand_dtypes)
    buffers, checker = _check_signature(func, tiled_dtypes + operand_dtypes)
    infos, stmts = _collect_blocks(func)
    _check_blocks(infos, stmts, checker)
    main_info = _main_block(infos)
    fa = _main_analysis(func, infos, main_info, stmts[main_info.name])
    _classify(fa, main_info, infos, buffers, tiled_dtypes, operand_dtypes)
    return fa


def _check_signature(func: tirx.PrimFunc,
                     tiled_dtypes: Tuple[str, ...]) -> Tuple[list, _IndexChecker]:
    """The function's buffer parameters and its index checker (its gather, if any), once the
    shapes, the indices, the parameters and the dtypes pass."""
    streaming_dtypes = tiled_dtypes + _INT_DTYPES
    # In TVM 0.27 every parameter is a tirx.Var (tirx.Buffer is Var): buffers are the Vars whose
    # type is a BufferType, scalars have a PrimType (and no usable .shape).
    buffers = [p for p in func.params if _is_buffer(p)]
    for buf in buffers:
        for i, s in enumerate(buf.shape):
            if _as_int(s, f"dimension {i} of {buf.name}") <= 0:
                raise UnsupportedError(f"empty tensor: dimension {i} of {buf.name} is {s} "
                                       "(roller needs non-empty static shapes)")

    # The index checks come before the dtype/scalar checks: for a gather through an int32 index
    # tensor, or a division by a scalar parameter, the indexing is the real reason.
    checker = _IndexChecker()
    checker.visit(func.body)
    if checker.error:
        raise UnsupportedError(checker.error)

    # a scalar parameter (a shape variable's value, e.g. the position a decode step computes
    # rotary angles at) is only a value here: the index checker declined it in an index, and
    # it cannot reach an extent (``_block_axes`` wants static ones)
    for p in func.params:
        if not _is_buffer(p) and not str(p.ty.dtype).startswith(("int", "uint", "float")):
            raise UnsupportedError(f"parameter {p} of type {p.ty.dtype} is neither a buffer nor "
                                   "a number")
    for buf in buffers:
        if str(buf.dtype) not in streaming_dtypes:
            raise UnsupportedError(
                f"dtype {buf.dtype} of {buf.name} is not handled by this backend "
                f"(supported: {', '.join(tiled_dtypes)}; integer and bool tensors in "
                "memory-bound kernels)")
    return buffers, checker


def _collect_blocks(func: tirx.PrimFunc) -> Tuple[List[BlockInfo], Dict[str, s_tir.SBlock]]:
    """One BlockInfo per child of the root block, in order, and each block by name."""
    if not _has_root_block(func):
        # e.g. TVM's legalized cumsum: a hand-written loop nest in one opaque block
        raise UnsupportedError("the function has no root block (a hand-written loop nest, "
                               "not a compute roller can tile)")
    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    block_rvs = sch.get_child_blocks(root)
    infos: List[BlockInfo] = []
    stmts = {}
    for rv in block_rvs:
        blk = sch.get(rv)
        loops = sch.get_loops(rv)
        if len(loops) and not all(sch.get(l).kind == 0 for l in loops):
            raise UnsupportedError(f"block {blk.name_hint} already has scheduled loops")
        stmts[blk.name_hint] = blk
        axes = _block_axes(blk)
        is_red = any(a.kind == "R" for a in axes)
        infos.append(BlockInfo(blk.name_hint, axes,
                               [r.source.name for r in blk.reads],
                               [w.source.name for w in blk.writes], is_red, not is_red))
    return infos, stmts


def _block_axes(blk) -> List[Axis]:
    """The block's iteration variables: static, non-empty, spatial or reduction."""
    axes = []
    for iv in blk.iter_vars:
        if iv.iter_type not in (_SPATIAL, _REDUCE):
            raise UnsupportedError(f"block {blk.name_hint}: iterator {iv.var} is neither "
                                   "spatial nor a commutative reduction")
        ext = _as_int(iv.dom.extent, f"extent of {iv.var}")
        if ext <= 0:
            raise UnsupportedError(f"block {blk.name_hint}: iterator {iv.var} has extent {ext} "
                                   "(empty iteration space)")
        axes.append(Axis(str(iv.var.name), ext, "S" if iv.iter_type == _SPATIAL else "R"))
    return axes


def _check_blocks(infos: Sequence[BlockInfo], stmts: Dict[str, s_tir.SBlock],
                  checker: _IndexChecker) -> None:
    if not infos:
        raise UnsupportedError("the function has no blocks under its root")
    # a gather (embedding lookup, take) is a memory-bound copy: streamed like any elementwise
    # function; one inside a reduction or a tiled kernel has no access pattern to tile by
    if checker.gather and any(b.is_reduction for b in infos):
        raise UnsupportedError(checker.gather + " inside a reduction")
    nested = [b.name for b in infos if _has_nested_block(stmts[b.name])]
    if nested:
        raise UnsupportedError(f"nested blocks are not supported: {nested}")


def _main_block(infos: Sequence[BlockInfo]) -> BlockInfo:
    """The anchor: the heaviest reduction, else the output stage."""
    reductions = [b for b in infos if b.is_reduction]
    if reductions:
        return max(reductions, key=lambda b: math.prod(a.extent for a in b.axes))
    return infos[-1]  # the output stage


def _main_analysis(func: tirx.PrimFunc, infos: List[BlockInfo], main_info: BlockInfo,
                   blk) -> FuncAnalysis:
    """The FuncAnalysis of the main block ``blk``: its accesses, flops, neighbours and vector
    axis (the kind still the default)."""
    dtype = str([p for p in func.params if _is_buffer(p)][-1].dtype)
    var_order = [iv.var for iv in blk.iter_vars]
    reads = [build_access(r, var_order, "read") for r in blk.reads
             if not _is_self_read(r, blk)]
    writes = [build_access(w, var_order, "write") for w in blk.writes]
    volume = math.prod(a.extent for a in main_info.axes)
    fa = FuncAnalysis(func=func, blocks=infos, main=main_info.name, axes=main_info.axes,
                      reads=reads, writes=writes, dtype=dtype, flops=2.0 * volume)
    idx = [b.name for b in infos].index(main_info.name)
    fa.producers = [b.name for b in infos[:idx]]
    fa.consumers = [b.name for b in infos[idx + 1:]]
    fa.vector_axis = _find_vector_axis(fa)
    return fa


def _classify(fa: FuncAnalysis, main_info: BlockInfo, infos: Sequence[BlockInfo], buffers,
              tiled_dtypes: Tuple[str, ...], operand_dtypes: Tuple[str, ...] = ()) -> None:
    """Set ``fa.kind``; a tiled kernel needs the tiled dtypes (or low-precision operands
    and their accumulators)."""
    low = any(r.dtype in operand_dtypes for r in fa.reads)
    if not main_info.is_reduction:
        fa.kind = "elementwise"
    elif fa.vector_axis is not None and (fa.axes[fa.vector_axis].extent >= 4 or
                                         _reuse_tiled(fa, tiled_dtypes)):
        fa.kind = "tiled"
    elif low and len(fa.reads) == 2 and operand_reuse(fa) >= _MIN_REUSE:
        fa.kind = "tiled"  # low-precision operands are packed for their products whatever
        # their layout (no vector axis needed)
    else:
        fa.kind = "reduction"
    if fa.kind == "tiled":
        allowed = tiled_dtypes
        if low:
            allowed = tiled_dtypes + operand_dtypes + ("int32",)
        bad = [f"{b.name}: {b.dtype}" for b in buffers if str(b.dtype) not in allowed]
        if bad and not _streams_integers(main_info, infos, buffers, tiled_dtypes):
            raise UnsupportedError(
                f"a compute-bound (tiled) kernel needs {' or '.join(tiled_dtypes)} tensors; "
                f"got dtype {', '.join(bad)}")
        if bad:  # an index-carrying reduction (argmax / argmin): streamed, as integers are
            fa.kind = "reduction"


def _streams_integers(main: BlockInfo, infos: Sequence[BlockInfo], buffers,
                      tiled_dtypes: Sequence[str]) -> bool:
    """A reduction whose only non-float tensors are integers the function computes (the index
    of an argmax / argmin and its copy out), none an input: a memory-bound row reduction, not
    a tile of multiply-adds."""
    computed = {w for b in infos for w in b.writes}
    return main.is_reduction and all(
        str(b.dtype) in tiled_dtypes or (b.name in computed and str(b.dtype).startswith("int"))
        for b in buffers)


def operand_reuse(fa: FuncAnalysis) -> float:
    """The most multiply-adds one element of any input feeds (iteration volume over the
    input's footprint): 1 for a streamed row, K for a GEMM operand, H·W for a filter."""
    full = tuple(a.extent for a in fa.axes)
    volume = math.prod(full)
    return max((volume / max(1, acc.footprint(full)) for acc in fa.reads), default=1.0)



# -- classification by reuse (convolutions with few output channels) -------------------------------
# an input element feeding at least this many multiply-adds makes a register tile pay even when
# the vector axis is shorter than 4 (a 3-channel output conv: its filter is reused H*W times)
_MIN_REUSE = 4


def _reuse_tiled(fa: FuncAnalysis, tiled_dtypes) -> bool:
    return fa.dtype in tiled_dtypes and operand_reuse(fa) >= _MIN_REUSE
# -- end classification by reuse ------------------------------------------------------------------


def _is_buffer(param) -> bool:
    return isinstance(getattr(param, "ty", None), BufferType)


def _has_root_block(func: tirx.PrimFunc) -> bool:
    body = func.body
    return isinstance(body, s_tir.stmt.SBlockRealize) and body.block.name_hint == "root"


def _is_self_read(region, blk) -> bool:
    # the reduction's own accumulator shows up as a read of the output buffer
    return any(region.source.same_as(w.source) for w in blk.writes)


def _has_nested_block(blk) -> bool:
    found = []

    def f(node):
        if isinstance(node, s_tir.stmt.SBlock) and not node.same_as(blk):
            found.append(node)

    post_order_visit(blk.body, f)
    return bool(found)


# largest input stride (elements) along a vector axis: a stride-2 or -3 window still shares cache
# lines between neighbouring lanes
_MAX_VECTOR_STRIDE = 4


def _find_vector_axis(fa: FuncAnalysis) -> Optional[int]:
    """The spatial axis that is innermost-contiguous in the output and in every input using it.

    Only such an axis can be vectorized with plain vector loads/stores (no gathers).
    """
    if not fa.writes:
        return None
    out = fa.writes[0]
    cand = out.innermost_axis()
    if cand is None or fa.axes[cand].kind != "S":
        return None
    users = [acc for acc in fa.reads if cand in acc.axes_used()]
    # every input using the axis must step by exactly one element along it: plain
    # innermost (A[.., j]) or a sliding window (X[.., x + rx], NCHW convolutions)
    if all(acc.unit_stride_innermost(cand) for acc in users):
        return cand
    # A strided window (X[.., 2x + rx], a stride-2 NCHW convolution) costs a strided load per
    # vector, still far better than no register tile at all when another input (the weights)
    # makes the block compute-bound: allow it for blocks reading two or more tensors.
    if len({acc.buffer for acc in fa.reads}) >= 2 and \
            all(acc.unit_stride_innermost(cand, _MAX_VECTOR_STRIDE) for acc in users):
        return cand
    return None
