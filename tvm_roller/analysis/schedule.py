"""Schedule helpers both backends' lowerings use: find a block's loops, split by tile factors."""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import List, Optional

from tvm import s_tir, tirx

from tvm_roller.analysis.size import tree_size
from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.core.errors import UnsupportedError

# what a refused schedule primitive raises in TVM 0.27: ScheduleError and InternalError are
# RuntimeErrors, failed checks surface as ValueError (there is no tvm.TVMError any more)
SCHEDULE_ERRORS = (RuntimeError, ValueError)


def attempt(fn, *args, **kwargs) -> bool:
    """Run a schedule primitive that TVM may refuse; whether it was applied (a refused
    primitive leaves the schedule as it was)."""
    try:
        fn(*args, **kwargs)
    except SCHEDULE_ERRORS:
        return False
    return True


#: an inlined stage may leave each of its readers with at most this many expression nodes
#: (``analysis.size``): three composed GELUs inlined into one another made one kernel of tens
#: of thousands of nodes, minutes of compile
INLINE_NODES = 3000


def inline_within(sch: s_tir.Schedule, block, limit: int = INLINE_NODES) -> bool:
    """``compute_inline`` of ``block`` when TVM allows it and its readers' bodies stay within
    ``limit`` nodes of expression; whether it was inlined."""
    readers = sch.get_consumers(block)
    trial = sch.copy()
    if not attempt(trial.compute_inline, block):
        return False
    if any(tree_size(trial.get(r).body, limit + 1) > limit for r in readers):
        return False
    sch.compute_inline(block)
    return True


def require(what: str, fn, *args, **kwargs):
    """Run a schedule primitive that must succeed; a refusal becomes an UnsupportedError
    saying what failed and TVM's reason."""
    try:
        return fn(*args, **kwargs)
    except SCHEDULE_ERRORS as err:
        lines = str(err).strip().splitlines()
        msg = next((l for l in lines if "Error" in l or "error" in l), lines[-1] if lines else "")
        raise UnsupportedError(f"{what} failed: {msg.strip()[:300]}") from None


def block_names(sch: s_tir.Schedule) -> List[str]:
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


def axis_loops(sch: s_tir.Schedule, block) -> list:
    """Loops of ``block`` in the order of its iteration variables (simple bindings only)."""
    loops = sch.get_loops(block)
    blk = sch.get(block)
    loop_vars = [sch.get(l).loop_var for l in loops]
    # the realize's bindings: find each iter var's loop
    binding = realize_of(sch, block).iter_values
    out = []
    for iv, val in zip(blk.iter_vars, binding):
        hit = [l for l, lv in zip(loops, loop_vars) if lv.same_as(val)]
        if len(hit) != 1:
            raise UnsupportedError(f"block {blk.name_hint}: iterator {iv.var} is not bound to a "
                                   "single loop")
        out.append(hit[0])
    return out


def realize_of(sch: s_tir.Schedule, block):
    loops = sch.get_loops(block)
    parent = sch.get(loops[-1]).body if loops else sch.get(sch.get_sblock("root")).body
    name = sch.get(block).name_hint
    for node in iter_realizes(parent):
        if node.block.name_hint == name:
            return node
    raise UnsupportedError(f"cannot find the realize of block {name}")


def iter_realizes(stmt):
    if isinstance(stmt, s_tir.stmt.SBlockRealize):
        yield stmt
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from iter_realizes(s)
    elif hasattr(stmt, "body") and not isinstance(stmt, s_tir.stmt.SBlock):
        yield from iter_realizes(stmt.body)


def is_padding(sch: s_tir.Schedule, name: str) -> bool:
    """A prologue that selects between its input and a constant (zero padding, T.if_then_else)."""
    found = []

    def visit(node):
        # the op is "prim.if_then_else" in TVM 0.27 ("tir.if_then_else" before)
        name = str(getattr(getattr(node, "op", None), "name", ""))
        if isinstance(node, tirx.Select) or name.endswith("if_then_else"):
            found.append(node)

    post_order_visit(sch.get(sch.get_sblock(name)).body, visit)
    return bool(found)


def is_reduction(sch: s_tir.Schedule, block) -> bool:
    return any(iv.iter_type == 2 for iv in sch.get(block).iter_vars)  # IterVar.CommReduce


def extent(sch: s_tir.Schedule, loop) -> Optional[int]:
    e = sch.get(loop).extent
    return int(e.value) if isinstance(e, tirx.IntImm) else None


# Set while a kernel is lowered to be replayed on a function with symbolic extents
# (``planner.buckets``): every split is then a plain one, whose outer factor TVM infers from
# the loop's extent, so the trace replays on any extent (a sampled perfect tile records
# numbers that hold for one extent only).
_PLAIN_SPLITS: contextvars.ContextVar[bool] = contextvars.ContextVar("plain_splits",
                                                                     default=False)


@contextlib.contextmanager
def plain_splits():
    """Within it, :func:`perfect_split` records no sampled tile sizes (see above)."""
    token = _PLAIN_SPLITS.set(True)
    try:
        yield
    finally:
        _PLAIN_SPLITS.reset(token)


def plain_splits_active() -> bool:
    """Inside :func:`plain_splits`: a loop's static extent may be symbolic on replay."""
    return _PLAIN_SPLITS.get()


def perfect_split(sch: s_tir.Schedule, loop, extent: int, inner: List[int]) -> list:
    """Split ``loop`` into (extent / prod(inner), *inner). When the factors divide the extent they
    are recorded as a sample_perfect_tile decision (mutable by MetaSchedule); otherwise, or
    within :func:`plain_splits`, it is a plain split whose outer loop rounds up (a predicate
    guards the tail)."""
    if any(f < 1 for f in inner):
        raise UnsupportedError(f"invalid tile factors {inner} for a loop of extent {extent}")
    prod = math.prod(inner)
    if extent % prod or _PLAIN_SPLITS.get():
        return sch.split(loop, [None, *inner])
    factors = [extent // prod, *inner]
    sampled = sch.sample_perfect_tile(loop, n=len(factors),
                                      max_innermost_factor=max(64, factors[-1]),
                                      decision=[int(f) for f in factors])
    return sch.split(loop, sampled)


def add_unit_loops(sch: s_tir.Schedule, every: bool = False) -> None:
    """A unit loop on top of each loopless block (``every``: of every block). A scalar output's
    blocks have no row loop to bind or compute at, and TVM 0.27's rfactor fails an internal
    check (``block_realize == old_block_realize_``) when a block beside the one it rewrites
    sits directly under the root, e.g. ``Y = sum(X) * 0.5``."""
    for name in block_names(sch):
        blk = sch.get_sblock(name)
        loops = sch.get_loops(blk)
        if every or not loops:
            sch.add_unit_loop(loops[0] if loops else blk)
