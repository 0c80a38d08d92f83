"""The data-movement model on one (sub-)problem: the ops of one fused nest (or one op alone) on
given extents, and for a loop order and tiles Chimera's movement per tensor, the memory usage and
the parallel tasks (``tvm_roller.fusion.movement``'s docstring states the model). Tile sizes may
be ints or numpy arrays (a whole grid at once)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Sequence, Tuple

import numpy as np

from tvm_roller.fusion.chain_spec import Chain, Op


@dataclass
class ProblemTensor:
    """A tensor of a problem: its loops, element size, whether it moves, its relevant loops."""

    name: str
    loops: Tuple[str, ...]
    elem_bytes: int
    free: bool  # stays on chip: costs no movement (still counts in MU)
    relevant: FrozenSet[str]  # loops of the ops touching it


@dataclass
class Problem:
    """The ops of one nest on given extents: its tensors, the loop groups its orders permute,
    the loops that may run in parallel."""

    extents: Dict[str, int]
    tensors: List[ProblemTensor]
    op_tensors: List[List[int]]  # per op, indices into tensors
    groups: List[List[str]]  # order = perm(group 0) + perm(group 1) + ...; loops of extent > 1
    parallel: FrozenSet[str]  # loops that may be split across cores (outermost prefix)
    untiled: FrozenSet[str]
    flops: float
    align: Dict[str, int] = field(default_factory=dict)  # tile must be a multiple (or the extent)

    def tiled_loops(self) -> List[str]:
        return [d for g in self.groups for d in g if d not in self.untiled]

    def orders(self) -> List[Tuple[str, ...]]:
        per_group = []
        for g in self.groups:
            tiled = [d for d in g if d not in self.untiled]
            fixed = [d for d in g if d in self.untiled]
            per_group.append([p + tuple(fixed) for p in itertools.permutations(tiled)])
        return [sum(combo, ()) for combo in itertools.product(*per_group)]


def build_problem(chain: Chain, ops: Sequence[Op], extents: Dict[str, int],
                  free_names: Sequence[str], line_bytes: int = 0) -> Problem:
    """The problem of ``ops`` run as one fused nest (or one op alone), on ``extents``.

    ``line_bytes``: the tile of each tensor's innermost (contiguous) loop must be a multiple of
    a cache line / transaction (ROLLER's alignment rule) unless it is the whole extent."""
    names = [t.name for t in chain.tensors if any(t.name in o.tensors for o in ops)]
    op_loops = [set(o.loops) for o in ops]
    tensors = []
    for tn in names:
        t = chain.tensor(tn)
        rel = frozenset().union(*[op_loops[i] for i, o in enumerate(ops) if tn in o.tensors])
        tensors.append(ProblemTensor(tn, tuple(t.loops), t.elem_bytes, tn in free_names, rel))
    op_tensors = [[names.index(tn) for tn in o.tensors] for o in ops]
    order_loops = [lp.name for lp in chain.loops
                   if any(lp.name in s for s in op_loops) and extents[lp.name] > 1]
    reductions = set().union(*[set(o.reduction) for o in ops])
    untiled = set(lp.name for lp in chain.loops if lp.untiled)
    if len(ops) > 1:
        shared = [d for d in order_loops if sum(d in s for s in op_loops) > 1]
        # an intermediate must be complete before it is consumed: a reduction loop of its
        # producer that encloses the consumer (a shared loop) gets a single trip
        for tn in free_names:
            producer = next((o for o in ops if tn in o.tensors), None)
            if producer is not None:
                untiled |= {d for d in producer.reduction if d in shared}
        groups = [shared]
        seen = set(shared)
        for s in op_loops:
            g = [d for d in order_loops if d in s and d not in seen]
            seen |= set(g)
            groups.append(g)
        parallel = frozenset(d for d in shared if d not in reductions)
    else:
        groups = [order_loops]
        parallel = frozenset(d for d in order_loops if d not in reductions)
    untiled = frozenset(untiled)
    flops = sum(2.0 * math.prod(extents[d] for d in o.loops) for o in ops)
    align: Dict[str, int] = {}
    if line_bytes:
        for t in tensors:
            if t.loops:
                d = t.loops[-1]
                align[d] = max(align.get(d, 1), max(1, line_bytes // t.elem_bytes))
    return Problem(dict(extents), tensors, op_tensors, [g for g in groups if g], parallel,
                   untiled, flops, align)


def trip_counts(p: Problem, tiles: Dict[str, Any]) -> Dict[str, Any]:
    """The trip count of every loop for these tiles."""
    return {d: -(-p.extents[d] // tiles[d]) for d in p.extents}  # ceil, works on arrays


def footprints(p: Problem, tiles: Dict[str, Any]) -> List[Any]:
    """Chimera's ``DF`` per tensor: the bytes of its tile."""
    out = []
    for t in p.tensors:
        f = t.elem_bytes
        for d in t.loops:
            f = f * tiles[d]
        out.append(f)
    return out


def memory_use(p: Problem, df: List[Any]) -> Any:
    """Chimera's ``MU``: the largest sum of ``DF`` over one op's tensors."""
    mu = None
    for idx in p.op_tensors:
        s = sum(df[i] for i in idx)
        mu = s if mu is None else np.maximum(mu, s)
    return mu


def multipliers(p: Problem, order: Sequence[str], trips: Dict[str, Any]) -> List[Any]:
    """Chimera's walk: per tensor, the product of trip counts of its relevant loops at or outside
    the innermost relevant loop that indexes it."""
    mults = []
    for t in p.tensors:
        mult, met = 1, False
        for d in reversed(order):
            if d not in t.relevant:
                continue
            if d in t.loops:
                met = True
            if met:
                mult = mult * trips[d]
        mults.append(mult)
    return mults


def parallel_tasks(p: Problem, order: Sequence[str], trips: Dict[str, Any]) -> Any:
    """Independent tasks: trip counts of the outermost run of parallel loops. The run ends at the
    first other loop even when its trip count is 1: a task runs everything inside the run, so
    the reuse the order claims inside it happens within one core."""
    tasks = np.int64(1)
    for d in order:
        if d not in p.parallel:
            break
        tasks = tasks * np.asarray(trips[d])
    return tasks


def evaluate(p: Problem, order: Sequence[str], tiles: Dict[str, Any]):
    """Per-tensor DM, MU and tasks for one order; ``tiles`` values may be ints or arrays."""
    trips = trip_counts(p, tiles)
    df = footprints(p, tiles)
    mults = multipliers(p, order, trips)
    dm = [0 * df[i] if t.free else df[i] * mults[i] for i, t in enumerate(p.tensors)]
    return dm, memory_use(p, df), parallel_tasks(p, order, trips)
