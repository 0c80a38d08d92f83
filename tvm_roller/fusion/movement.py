"""Analytical data-movement model for fused chains of compute-intensive operators (Chimera).

Chimera (Zheng et al., HPCA'23; shared/papers.md section 2.1) splits a chain such as
``C = A.B; E = C.D`` into computation blocks, keeps the intermediate ``C`` on chip, and chooses the
block execution order and the block (tile) sizes that minimise the data moved between memory
levels. This module is that model, generalised to any chain described by its loops and index sets,
plus the unfused baseline and the decision whether to fuse. It is plain Python (math, itertools,
numpy); it never imports TVM, so a chain can be planned from a description built anywhere.

Input
-----
A :class:`Chain` lists the :class:`Loop` s (name, extent), the :class:`TensorUse` s (which loops
index each tensor, its element size and role) and the :class:`Op` s (the loops each op iterates,
which of them it reduces over, the tensors it touches). ``gemm_chain``, ``mlp_chain`` and
``conv_chain`` build the common cases.

Model (Chimera Algorithm 1)
---------------------------
For a loop order (outermost first) and a tile size per loop, the movement of tensor T into the
level that holds the tiles is::

    DM(T) = DF(T) * prod(ceil(L_p / s_p) for p at or outside the innermost loop indexing T)
    DF(T) = elem_bytes * prod(s_d for d in loops(T))

Loops are walked inner to outer; once a loop indexing T is met, that loop and every loop further
out multiplies T's movement by its trip count. Only loops *relevant* to T count: the loops of the
ops that touch T (a loop private to the producer, e.g. ``k`` of ``C = A.B``, never multiplies the
consumer's tensors ``D`` and ``E``). An ``intermediate`` tensor costs nothing when the chain is
fused (it stays on chip) but its tile must fit: the memory usage ``MU = max over ops of the sum
of DF over that op's tensors`` (intermediate tile included) must not exceed the usable capacity.

The rule is Chimera's strict one: a loop indexing T starts the multiplication even when its tile
covers the whole extent (trip count 1). A reduction output (``E`` above, reduced over ``l``) is
counted once per visit, as in Chimera's closed form, not twice for the partial-sum read and write.

Fused loop orders. In a fused nest the loops shared by several ops (the intermediate's loops)
enclose each op's private loops, which run as sibling nests inside a block::

    for b, m, l (shared, some order):          # one block of C
        for k (private to gemm1): C_tile += A_tile . B_tile
        for n (private to gemm2): E_tile += C_tile . D_tile

so the orders searched are: every permutation of the shared loops, followed by every permutation
of each op's private loops. Orders with a private loop outside a shared one are not valid without
recomputing the producer (not modelled) and are not searched. An intermediate must be complete
before it is consumed, so a reduction loop of its producer that is shared (encloses the consumer:
``l`` when ``E = C.D`` feeds a third op) takes its full extent. Loops of extent 1 are dropped;
``untiled`` loops (a convolution window) always use their full extent and sit innermost in their
group.

Convolutions. A sliding window is approximated by its output-spatial loops: the input of a
KxK convolution is indexed by the output loops ``h, w`` (its footprint ignores the K-1 halo rows
and columns, and strides are not modelled); the window loops ``r, s`` are ``untiled``.

Memory levels and bandwidths (the convention)
---------------------------------------------
``dev`` is a :class:`tvm_roller.hardware.DeviceModel` (only duck-typed: ``levels``,
``num_units``, ``peak_per_unit``, ``cpu.dram_gbs_single_core``; capacities and bandwidths of
private levels are per core, shared levels are whole-chip). With levels fastest first:

* **tile level** ``T``: the largest private level (``L2`` on a CPU, ``SMEM`` on a GPU). The fused
  blocks (and each unfused op's blocks) are sized so that ``MU <= fill * capacity(T)`` per core
  (``fill`` 0.5 on a CPU, as the single-op policy uses, 1.0 on a GPU). The tile of each
  tensor's innermost (contiguous) loop is a multiple of a cache line (16 float32) or the whole
  extent (ROLLER's transaction-alignment rule; without it the model, blind to anything inside a
  block, happily picks tiles of 1 for loops that only affect MU).
* **outer level** ``O``: the first level below ``T`` that holds the whole footprint of the chain
  (fused: inputs and outputs; unfused op: all its tensors, intermediate included), else DRAM.
* traffic *into* a level is served at the bandwidth of the level *below* it (the one it is read
  from): volume ``T<-O`` (the Chimera volume above) at ``bw(O)``; volume ``I<-T`` (the level
  ``I`` just inside ``T``, ``L1`` on a CPU) at ``bw(T)``; and when ``O`` is not DRAM the
  compulsory volume ``O<-DRAM`` (every input and output once, cold) at DRAM bandwidth. On a
  CPU: tiles sized for L2 stream from L3 (if the footprint fits L3) or DRAM, L1 blocks stream
  from L2; on a GPU: shared-memory tiles stream from L2 or DRAM.
* parallelism: the outermost loops that are parallel (not a reduction of any op and, when fused,
  shared by the ops) give ``tasks = prod(trip counts)``; ``busy = min(tasks, cores)`` and the
  busiest core does ``waves / tasks`` of the work, ``waves = ceil(tasks / cores)`` (wave
  quantisation). A private level gives every core its full bandwidth; a shared level gives each
  busy core ``min(single-core bandwidth, total / busy)`` (single core: ``dram_gbs_single_core``
  for DRAM where the preset has it, else total / cores).
* time of each term = its volume * waves / tasks / per-core bandwidth; ``compute`` = FLOPs *
  waves / tasks / peak per core (the preset's peak: an upper bound, the repo's GEMM kernels reach
  about 3/4 of it). A plan's time is the largest term: Chimera's ``max_d DV_d / bw_d`` with, by
  default, compute as one more term (a roofline). ``include_compute=False`` gives Chimera's
  movement-only time; the compute time is reported either way. Unfused ops run one after the
  other: the unfused time is the sum over ops of each op's largest term.
* the inner level: each op gets one tiling for ``I`` (order and tiles with the least volume over
  the full extents, Chimera's model again, fill as above), chosen before the tile level, bottom-up
  as in ROLLER. Inside a tile-level block it is clamped to the block, and the volume into ``I`` is
  ``number of blocks x the model's volume of one block``. The tile-level search counts it, so a
  block too thin in a reduction loop (which re-streams the accumulator tile into L1) is avoided.

Unfused baseline: each op alone, with its own best order and tiles, the intermediate an ordinary
tensor (written by the producer, read by the consumer, each through the same formula: at least its
full size each way). If the intermediate fits the tile level's usable capacity, it is taken to stay
there between the two ops and costs nothing unfused either (fusion then saves little).

Decision: fuse when the predicted fused time < 0.95 x the unfused time.

Two plans per nest are reported: the *best* plan (least predicted time; the search minimises the
largest term + 0.1 x the sum of the movement terms, so among near-equal times less traffic wins)
and the *least-traffic* plan (Chimera's own objective: least volume into the tile level,
parallelism ignored). They differ when splitting work over cores forces re-reads: a fused nest can
only be split along shared loops that no op reduces (``b, m`` of the GEMM chain), so every task
re-reads its share of ``B`` and ``D`` (of the weights, for an MLP).

Search: for every valid order, tile sizes from a ladder of divisors and near-divisors (padding
waste <= 10 %) of each extent, about two per octave (1, 2, 3, 4, 6, 8, 12, ...), evaluated
with numpy over the whole grid (the grid is thinned when it is large), then refined by
coordinate descent over the full ladder from the three best orders. A chain of two GEMMs plans
in about 20 ms.
"""
from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "Loop", "TensorUse", "Op", "Chain", "ChainPlan", "plan_chain", "format_plan",
    "data_movement", "memory_usage", "tile_candidates", "gemm_chain", "mlp_chain", "conv_chain",
    "FUSE_THRESHOLD",
]

FUSE_THRESHOLD = 0.95  # fuse only when fused time < FUSE_THRESHOLD * unfused time
MAX_PADDING_WASTE = 0.10
_CPU_FILL = 0.5  # of a cache the tiles may use (backends/cpu/policy.py uses the same for L1/L2)
_GPU_FILL = 1.0  # shared memory is managed explicitly
_GRID_BUDGET = 1_500_000  # tile combinations x orders evaluated per search before thinning
_MIN_GRID = 4096
_TRAFFIC_WEIGHT = 0.1  # search objective: largest term + this x the sum of the movement terms

_DTYPE_OF_BYTES = {1: "int8", 2: "float16", 4: "float32", 8: "float64"}


# ------------------------------------------------------------------------------------------------
# input description
# ------------------------------------------------------------------------------------------------
@dataclass
class Loop:
    """One loop of the chain. ``untiled`` loops (a convolution window) always take their full
    extent as the tile size."""

    name: str
    extent: int
    untiled: bool = False


@dataclass
class TensorUse:
    """A tensor: the loops indexing it, its element size and role ("input", "output" or
    "intermediate": produced by one op and consumed by the next, on chip when fused)."""

    name: str
    loops: Tuple[str, ...]
    elem_bytes: int
    role: str
    dtype: str = ""  # optional, only for messages ("float32"); derived from elem_bytes if empty

    @property
    def dtype_name(self) -> str:
        return self.dtype or _DTYPE_OF_BYTES.get(self.elem_bytes, f"{self.elem_bytes}-byte")


@dataclass
class Op:
    """One compute-intensive op: every loop it iterates (spatial and reduction), which of them
    it reduces over, and the tensors it touches."""

    name: str
    loops: Tuple[str, ...]
    reduction: Tuple[str, ...]
    tensors: Tuple[str, ...]


@dataclass
class Chain:
    loops: List[Loop]
    tensors: List[TensorUse]
    ops: List[Op]
    name: str = ""

    # -- lookups -------------------------------------------------------------------------------
    def extents(self) -> Dict[str, int]:
        return {lp.name: int(lp.extent) for lp in self.loops}

    def loop(self, name: str) -> Loop:
        for lp in self.loops:
            if lp.name == name:
                return lp
        raise KeyError(name)

    def tensor(self, name: str) -> TensorUse:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def intermediates(self) -> List[TensorUse]:
        return [t for t in self.tensors if t.role == "intermediate"]

    def tensor_bytes(self, name: str) -> int:
        t, ext = self.tensor(name), self.extents()
        return t.elem_bytes * math.prod(ext[d] for d in t.loops)

    def op_flops(self, op: Op) -> float:
        ext = self.extents()
        return 2.0 * math.prod(ext[d] for d in op.loops)

    def flops(self) -> float:
        return sum(self.op_flops(o) for o in self.ops)

    def validate(self) -> None:
        """Raise ValueError on an inconsistent description."""
        names = [lp.name for lp in self.loops]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate loop names in {names}")
        for lp in self.loops:
            if int(lp.extent) < 1:
                raise ValueError(f"loop {lp.name} has extent {lp.extent}")
        tnames = [t.name for t in self.tensors]
        if len(set(tnames)) != len(tnames):
            raise ValueError(f"duplicate tensor names in {tnames}")
        for t in self.tensors:
            if t.role not in ("input", "output", "intermediate"):
                raise ValueError(f"tensor {t.name}: role {t.role!r} is not input, output or "
                                 "intermediate")
            if t.elem_bytes < 1:
                raise ValueError(f"tensor {t.name}: elem_bytes {t.elem_bytes}")
            for d in t.loops:
                if d not in names:
                    raise ValueError(f"tensor {t.name} is indexed by unknown loop {d!r}")
        if not self.ops:
            raise ValueError("a chain needs at least one op")
        for o in self.ops:
            for d in o.loops:
                if d not in names:
                    raise ValueError(f"op {o.name} iterates unknown loop {d!r}")
            for d in o.reduction:
                if d not in o.loops:
                    raise ValueError(f"op {o.name}: reduction loop {d!r} is not one of its loops")
            for tn in o.tensors:
                if tn not in tnames:
                    raise ValueError(f"op {o.name} touches unknown tensor {tn!r}")
                missing = set(self.tensor(tn).loops) - set(o.loops)
                if missing:
                    raise ValueError(f"tensor {tn} is indexed by {sorted(missing)}, which op "
                                     f"{o.name} does not iterate")
        for t in self.intermediates():
            users = [o.name for o in self.ops if t.name in o.tensors]
            if len(users) < 2:
                raise ValueError(f"intermediate {t.name} must be touched by two ops, not {users}")

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "loops": [asdict(lp) for lp in self.loops],
            "tensors": [{**asdict(t), "loops": list(t.loops)} for t in self.tensors],
            "ops": [{"name": o.name, "loops": list(o.loops), "reduction": list(o.reduction),
                     "tensors": list(o.tensors)} for o in self.ops],
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Chain":
        return cls(
            loops=[Loop(**lp) for lp in d["loops"]],
            tensors=[TensorUse(**{**t, "loops": tuple(t["loops"])}) for t in d["tensors"]],
            ops=[Op(o["name"], tuple(o["loops"]), tuple(o["reduction"]), tuple(o["tensors"]))
                 for o in d["ops"]],
            name=d.get("name", ""),
        )


# ------------------------------------------------------------------------------------------------
# builders
# ------------------------------------------------------------------------------------------------
def gemm_chain(batch: int, m: int, k: int, l: int, n: int, elem_bytes: int = 4, *,
               batched_weights: bool = True, names: Sequence[str] = "ABCDE") -> Chain:
    """``C[b,m,l] = sum_k A[b,m,k] B[b,k,l]; E[b,m,n] = sum_l C[b,m,l] D[b,l,n]`` (attention-like
    batch GEMM chain). ``batched_weights=False``: B and D are not indexed by ``b``."""
    A, B, C, D, E = names
    w = ("b",) if batched_weights else ()
    dtype = _DTYPE_OF_BYTES.get(elem_bytes, "")
    return Chain(
        loops=[Loop("b", batch), Loop("m", m), Loop("k", k), Loop("l", l), Loop("n", n)],
        tensors=[TensorUse(A, ("b", "m", "k"), elem_bytes, "input", dtype),
                 TensorUse(B, w + ("k", "l"), elem_bytes, "input", dtype),
                 TensorUse(C, ("b", "m", "l"), elem_bytes, "intermediate", dtype),
                 TensorUse(D, w + ("l", "n"), elem_bytes, "input", dtype),
                 TensorUse(E, ("b", "m", "n"), elem_bytes, "output", dtype)],
        ops=[Op("gemm1", ("b", "m", "l", "k"), ("k",), (A, B, C)),
             Op("gemm2", ("b", "m", "n", "l"), ("l",), (C, D, E))],
        name=f"gemm_chain b{batch} {m}x{k}x{l}x{n}",
    )


def mlp_chain(tokens: int, d_model: int, d_hidden: int, d_out: Optional[int] = None,
              elem_bytes: int = 4) -> Chain:
    """``H = X.W1`` (tokens x d_hidden), ``Y = H.W2`` (tokens x d_out): an MLP block without its
    activation (elementwise ops act on the intermediate in place and are not ops here)."""
    ch = gemm_chain(1, tokens, d_model, d_hidden, d_model if d_out is None else d_out,
                    elem_bytes, batched_weights=False, names=("X", "W1", "H", "W2", "Y"))
    ch.name = f"mlp {tokens}x{d_model} -> {d_hidden} -> {d_model if d_out is None else d_out}"
    return ch


def conv_chain(n: int, h: int, w: int, c_in: int, c_mid: int, c_out: int, kh: int = 3,
               kw: int = 3, elem_bytes: int = 4) -> Chain:
    """A KxK convolution (stride 1, 'same' padding) followed by a 1x1 convolution, NHWC:
    ``Y[n,h,w,cm] = sum_{r,s,ci} X[n,h+r,w+s,ci] W1[r,s,ci,cm]``,
    ``Z[n,h,w,co] = sum_cm Y[n,h,w,cm] W2[cm,co]``.

    Approximation: ``X`` is indexed by the output loops ``h, w`` (the K-1 halo is ignored);
    ``r, s`` are untiled."""
    dtype = _DTYPE_OF_BYTES.get(elem_bytes, "")
    return Chain(
        loops=[Loop("n", n), Loop("h", h), Loop("w", w), Loop("ci", c_in), Loop("cm", c_mid),
               Loop("co", c_out), Loop("r", kh, untiled=True), Loop("s", kw, untiled=True)],
        tensors=[TensorUse("X", ("n", "h", "w", "ci"), elem_bytes, "input", dtype),
                 TensorUse("W1", ("r", "s", "ci", "cm"), elem_bytes, "input", dtype),
                 TensorUse("Y", ("n", "h", "w", "cm"), elem_bytes, "intermediate", dtype),
                 TensorUse("W2", ("cm", "co"), elem_bytes, "input", dtype),
                 TensorUse("Z", ("n", "h", "w", "co"), elem_bytes, "output", dtype)],
        ops=[Op("conv1", ("n", "h", "w", "cm", "ci", "r", "s"), ("ci", "r", "s"),
                ("X", "W1", "Y")),
             Op("conv2", ("n", "h", "w", "co", "cm"), ("cm",), ("Y", "W2", "Z"))],
        name=f"conv{kh}x{kw}+1x1 n{n} {h}x{w} {c_in}->{c_mid}->{c_out}",
    )


# ------------------------------------------------------------------------------------------------
# tile candidates
# ------------------------------------------------------------------------------------------------
def _divisors(e: int) -> List[int]:
    out = []
    i = 1
    while i * i <= e:
        if e % i == 0:
            out += [i, e // i]
        i += 1
    return sorted(set(out))


def _waste(e: int, t: int) -> float:
    return (math.ceil(e / t) * t - e) / e


def tile_candidates(extent: int, max_waste: float = MAX_PADDING_WASTE) -> List[int]:
    """Tile sizes for one loop: divisors and near-divisors (padding waste <= ``max_waste``) of
    ``extent``, about two per octave (near 1, 2, 3, 4, 6, 8, 12, 16, ...), plus the extent."""
    e = int(extent)
    if e <= 1:
        return [1]
    divs = _divisors(e)
    ladder = sorted({(1 << i) for i in range(e.bit_length() + 1)} |
                    {3 * (1 << i) for i in range(e.bit_length())})
    ladder = [v for v in ladder if v <= e]
    chosen = {e}
    for v in ladder:
        near = [d for d in divs if abs(math.log(d / v)) <= math.log(1.5)]
        if near:  # an exact divisor near the ladder point
            chosen.add(min(near, key=lambda d: (abs(math.log(d / v)), -d)))
            continue
        # a near-divisor: the ladder size itself, else the balanced split into ceil(e/v) tiles
        for t in (v, math.ceil(e / math.ceil(e / v))):
            if _waste(e, t) <= max_waste + 1e-12:
                chosen.add(t)
                break
    return sorted(chosen)


# ------------------------------------------------------------------------------------------------
# the model on one (sub-)problem
# ------------------------------------------------------------------------------------------------
@dataclass
class _Tensor:
    name: str
    loops: Tuple[str, ...]
    elem_bytes: int
    free: bool  # stays on chip: costs no movement (still counts in MU)
    relevant: FrozenSet[str]  # loops of the ops touching it


@dataclass
class _Problem:
    extents: Dict[str, int]
    tensors: List[_Tensor]
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


def _problem(chain: Chain, ops: Sequence[Op], extents: Dict[str, int],
             free_names: Sequence[str], line_bytes: int = 0) -> _Problem:
    """The problem of ``ops`` run as one fused nest (or one op alone), on ``extents``.

    ``line_bytes``: the tile of each tensor's innermost (contiguous) loop must be a multiple of
    a cache line / transaction (ROLLER's alignment rule) unless it is the whole extent."""
    names = [t.name for t in chain.tensors if any(t.name in o.tensors for o in ops)]
    op_loops = [set(o.loops) for o in ops]
    tensors = []
    for tn in names:
        t = chain.tensor(tn)
        rel = frozenset().union(*[op_loops[i] for i, o in enumerate(ops) if tn in o.tensors])
        tensors.append(_Tensor(tn, tuple(t.loops), t.elem_bytes, tn in free_names, rel))
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
    return _Problem(dict(extents), tensors, op_tensors, [g for g in groups if g], parallel,
                    untiled, flops, align)


def _trips(p: _Problem, tiles: Dict[str, Any]) -> Dict[str, Any]:
    return {d: -(-p.extents[d] // tiles[d]) for d in p.extents}  # ceil, works on arrays


def _footprints(p: _Problem, tiles: Dict[str, Any]) -> List[Any]:
    out = []
    for t in p.tensors:
        f = t.elem_bytes
        for d in t.loops:
            f = f * tiles[d]
        out.append(f)
    return out


def _usage(p: _Problem, df: List[Any]) -> Any:
    mu = None
    for idx in p.op_tensors:
        s = sum(df[i] for i in idx)
        mu = s if mu is None else np.maximum(mu, s)
    return mu


def _multipliers(p: _Problem, order: Sequence[str], trips: Dict[str, Any]) -> List[Any]:
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


def _tasks(p: _Problem, order: Sequence[str], trips: Dict[str, Any]) -> Any:
    """Independent tasks: trip counts of the outermost run of parallel loops. The run ends at the
    first other loop even when its trip count is 1: a task runs everything inside the run, so
    the reuse the order claims inside it happens within one core."""
    tasks = np.int64(1)
    for d in order:
        if d not in p.parallel:
            break
        tasks = tasks * np.asarray(trips[d])
    return tasks


def _evaluate(p: _Problem, order: Sequence[str], tiles: Dict[str, Any]):
    """Per-tensor DM, MU and tasks for one order; ``tiles`` values may be ints or arrays."""
    trips = _trips(p, tiles)
    df = _footprints(p, tiles)
    mults = _multipliers(p, order, trips)
    dm = [0 * df[i] if t.free else df[i] * mults[i] for i, t in enumerate(p.tensors)]
    return dm, _usage(p, df), _tasks(p, order, trips)


@dataclass
class _Best:
    order: Tuple[str, ...]
    tiles: Dict[str, int]
    dm: Dict[str, int]
    mu: int
    tasks: int
    score: float


def _search(p: _Problem, capacity: float, score: Callable[..., Any],
            max_waste: float = MAX_PADDING_WASTE) -> _Best:
    """Best order and tiles of ``p`` under ``MU <= capacity``; ``score(dv, tasks, tiles, mu)``
    (arrays; ``tiles`` maps every loop to its tile sizes) is minimised. A grid over the
    (thinned) ladders for every order, then coordinate descent over the full ladders from the
    best three orders."""
    orders = p.orders() or [()]
    tiled = p.tiled_loops()
    full = {}
    for d in tiled:
        e, a = p.extents[d], p.align.get(d, 1)
        full[d] = [c for c in tile_candidates(e, max_waste) if c % a == 0 or c == e]
    cands = {d: list(v) for d, v in full.items()}
    budget = max(_MIN_GRID, _GRID_BUDGET // len(orders))
    while math.prod(len(v) for v in cands.values()) > budget:
        d = max(cands, key=lambda x: len(cands[x]))
        v = cands[d]
        if len(v) <= 2:
            break
        cands[d] = v[::2] if v[-1] in v[::2] else v[::2] + [v[-1]]  # keep the full extent
    fixed = {d: p.extents[d] for d in p.extents if d not in cands}

    def _grid(values: Dict[str, Sequence[int]]) -> Dict[str, np.ndarray]:
        if not tiled:
            return {d: np.array([v], dtype=np.int64) for d, v in fixed.items()}
        grids = np.meshgrid(*[np.asarray(values[d], dtype=np.int64) for d in tiled],
                            indexing="ij")
        out = {d: g.ravel() for d, g in zip(tiled, grids)}
        n = out[tiled[0]].shape
        out.update({d: np.full(n, v, dtype=np.int64) for d, v in fixed.items()})
        return out

    def _scores(order, tiles, df, trips, mu):
        mults = _multipliers(p, order, trips)
        dv = np.zeros(mu.shape)
        for i, t in enumerate(p.tensors):
            if not t.free:
                dv = dv + df[i] * mults[i]
        tasks = _tasks(p, order, trips) + np.zeros(mu.shape, dtype=np.int64)
        return np.asarray(score(dv, tasks, tiles, mu), dtype=np.float64) + np.zeros(mu.shape)

    tiles = _grid(cands)
    df = _footprints(p, tiles)
    mu = np.asarray(_usage(p, df))
    min_mu = float(mu.min())
    limit = capacity if min_mu <= capacity else min_mu  # nothing fits: the smallest blocks
    ok = mu <= limit
    tiles = {d: v[ok] for d, v in tiles.items()}
    df, mu = [np.asarray(f)[ok] for f in df], mu[ok]
    trips = _trips(p, tiles)
    ranked = []
    for order in orders:
        s = _scores(order, tiles, df, trips, mu)
        i = int(np.argmin(s))
        ranked.append((float(s[i]), order, {d: int(tiles[d][i]) for d in tiles}))
    ranked.sort(key=lambda r: r[0])

    best = None
    for s0, order, pt in ranked[:3]:
        cur, cur_s = dict(pt), s0
        for _ in range(8):
            improved = False
            for d in tiled:
                vals = np.asarray(full[d], dtype=np.int64)
                trial = {k: (vals if k == d else np.full(vals.shape, v, dtype=np.int64))
                         for k, v in cur.items()}
                tdf = _footprints(p, trial)
                tmu = np.asarray(_usage(p, tdf))
                s = _scores(order, trial, tdf, _trips(p, trial), tmu)
                s = np.where(tmu <= limit, s, np.inf)
                i = int(np.argmin(s))
                if s[i] < cur_s * (1 - 1e-9):
                    cur, cur_s, improved = {**cur, d: int(vals[i])}, float(s[i]), True
            if not improved:
                break
        if best is None or cur_s < best[0]:
            best = (cur_s, order, cur)
    s_best, order, pt = best
    dm, m, tk = _evaluate(p, order, pt)
    return _Best(tuple(order), {d: int(v) for d, v in pt.items()},
                 {t.name: int(v) for t, v in zip(p.tensors, dm)}, int(m), int(tk), s_best)


# ------------------------------------------------------------------------------------------------
# public helpers on a chain
# ------------------------------------------------------------------------------------------------
def _fused_problem(chain: Chain, extents: Optional[Dict[str, int]] = None,
                   line_bytes: int = 0) -> _Problem:
    ext = chain.extents() if extents is None else extents
    return _problem(chain, chain.ops, ext,
                    [t.name for t in chain.intermediates()] if len(chain.ops) > 1 else [],
                    line_bytes)


def _complete_tiles(chain: Chain, tiles: Dict[str, int]) -> Dict[str, int]:
    ext = chain.extents()
    out = {}
    for lp in chain.loops:
        t = ext[lp.name] if lp.untiled else int(tiles.get(lp.name, ext[lp.name]))
        out[lp.name] = max(1, min(t, ext[lp.name]))
    return out


def data_movement(chain: Chain, order: Sequence[str], tiles: Dict[str, int],
                  fused: bool = True) -> Dict[str, int]:
    """Bytes moved into the tile level per tensor, for a fused order and tiles (Chimera's
    ``DM(T)``). ``order`` lists loops outermost first (loops it omits are placed innermost);
    loops missing from ``tiles`` use their full extent. ``fused=False`` charges the intermediate
    like any other tensor (the same nest, but the intermediate spilled)."""
    chain.validate()
    tl = _complete_tiles(chain, tiles)
    ext = chain.extents()
    full = list(order) + [lp.name for lp in chain.loops if lp.name not in order]
    full = [d for d in full if ext[d] > 1]
    free = [t.name for t in chain.intermediates()] if fused else []
    p = _problem(chain, chain.ops, ext, free)
    dm, _, _ = _evaluate(p, full, tl)
    return {t.name: int(v) for t, v in zip(p.tensors, dm)}


def memory_usage(chain: Chain, tiles: Dict[str, int]) -> int:
    """``MU = max over ops of the sum of DF`` (bytes) for these tiles."""
    tl = _complete_tiles(chain, tiles)
    p = _fused_problem(chain)
    return int(_usage(p, _footprints(p, tl)))


# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------
def _core_bw(dev, idx: int, busy: Any) -> Any:
    """Bytes/s each of ``busy`` cores gets from level ``idx``."""
    lvl = dev.levels[idx]
    total = lvl.bandwidth_gbs * 1e9
    if not lvl.shared:
        return total + 0 * busy
    single = None
    if idx == len(dev.levels) - 1:
        traits = getattr(dev, "cpu", None)  # a GPU model has none
        single = traits.dram_gbs_single_core if traits is not None else None
    single = single * 1e9 if single else total / max(1, dev.num_units)
    return np.minimum(single, total / np.maximum(busy, 1))


def _outer_index(dev, tile_idx: int, footprint: float) -> int:
    for i in range(tile_idx + 1, len(dev.levels) - 1):
        if footprint <= dev.levels[i].capacity_bytes:
            return i
    return len(dev.levels) - 1


def _dtype(chain: Chain) -> str:
    return max(chain.tensors, key=lambda t: t.elem_bytes).dtype_name if chain.tensors else "float32"


@dataclass
class _Levels:
    tile: int
    inner: Optional[int]
    fill: float

    def usable(self, dev, idx: int) -> float:
        return dev.levels[idx].capacity_bytes * self.fill


def _levels(dev, fill: Optional[float], tile_level: Optional[str]) -> _Levels:
    n = len(dev.levels)
    if tile_level is not None:
        tile = [lv.name for lv in dev.levels].index(tile_level)
    else:
        private = [i for i, lv in enumerate(dev.levels[:-1]) if not lv.shared]
        tile = private[-1] if private else 0
    if tile >= n - 1:
        raise ValueError("the tile level must be above the outermost memory level")
    if fill is None:
        fill = _CPU_FILL if getattr(dev, "kind", "cpu") == "cpu" else _GPU_FILL
    return _Levels(tile, tile - 1 if tile > 0 else None, fill)


@dataclass
class _Inner:
    """One op's tiling for the inner level (L1), chosen once over the full extents (least
    volume); inside a block of the tile level it is clamped to the block."""

    op: Op
    level: str
    order: Tuple[str, ...]
    tiles: Dict[str, int]
    tensors: List[Tuple[Tuple[str, ...], int]]  # (loops, elem_bytes) of the op's tensors

    def volume(self, ext: Dict[str, int], block: Dict[str, Any]) -> Any:
        """Bytes moved into the inner level over the whole op when it runs in blocks of
        ``block`` (ints or arrays): number of blocks x the model's volume of one block."""
        loops = self.op.loops
        sub = {d: np.minimum(self.tiles.get(d, 1), block[d]) for d in loops}
        sub_trips = {d: -(-np.asarray(block[d]) // sub[d]) for d in loops}
        blocks = 1
        for d in loops:
            blocks = blocks * -(-ext[d] // np.asarray(block[d]))
        total = 0
        for tloops, elem in self.tensors:
            df = elem
            for d in tloops:
                df = df * sub[d]
            mult, met = 1, False
            for d in reversed(self.order):
                if d in tloops:
                    met = True
                if met:
                    mult = mult * sub_trips[d]
            total = total + df * mult
        return blocks * total


def _inner_tiling(chain: Chain, dev, lv: _Levels, op: Op) -> Optional[_Inner]:
    if lv.inner is None:
        return None
    inner = dev.levels[lv.inner]
    p = _problem(chain, [op], chain.extents(), [], inner.line_bytes)
    # least volume; among equals the largest tiles (fewer blocks, longer inner loops)
    best = _search(p, lv.usable(dev, lv.inner), lambda dv, tasks, tiles, mu: dv - 1e-6 * mu)
    return _Inner(op, inner.name, best.order, {d: best.tiles[d] for d in op.loops},
                  [(chain.tensor(tn).loops, chain.tensor(tn).elem_bytes) for tn in op.tensors])


def _inner_info(inner: _Inner, ext: Dict[str, int], block: Dict[str, int]) -> Dict[str, Any]:
    return {"op": inner.op.name, "level": inner.level, "order": list(inner.order),
            "tiles": {d: int(min(inner.tiles[d], block[d])) for d in inner.op.loops},
            "blocks": int(math.prod(-(-ext[d] // block[d]) for d in inner.op.loops)),
            "volume": int(inner.volume(ext, block))}


class _Timer:
    """Per-term times (seconds) of one nest: the volume into the tile level from ``outer``, the
    volume into the inner level (from the tile level), the compulsory DRAM volume when ``outer``
    is not DRAM, and (optionally) compute; all with parallelism and wave quantisation."""

    def __init__(self, dev, lv: _Levels, outer: int, compulsory: float, flops: float,
                 dtype: str, include_compute: bool, inner: Sequence[Optional[_Inner]],
                 extents: Dict[str, int]):
        self.dev, self.lv, self.outer = dev, lv, outer
        self.compulsory, self.flops = compulsory, flops
        self.inner, self.extents = [i for i in inner if i is not None], extents
        self.peak = dev.peak_per_unit(dtype) * 1e9
        self.include_compute = include_compute
        names = [x.name for x in dev.levels]
        self.key_tile = f"{names[lv.tile]}<-{names[outer]}"
        self.key_inner = (f"{names[lv.inner]}<-{names[lv.tile]}"
                          if lv.inner is not None and self.inner else None)
        self.key_dram = f"{names[outer]}<-{names[-1]}" if outer != len(names) - 1 else None

    def _frac(self, tasks):
        tasks = np.maximum(np.asarray(tasks, dtype=np.float64), 1.0)
        cores = max(1, self.dev.num_units)
        return np.ceil(tasks / cores) / tasks, np.minimum(tasks, cores)

    def compute(self, tasks) -> Any:
        frac, _ = self._frac(tasks)
        return self.flops * frac / self.peak

    def inner_volume(self, tiles: Dict[str, Any]) -> Any:
        return sum(i.volume(self.extents, tiles) for i in self.inner) if self.inner else 0

    def terms(self, dv_tile, tasks, dv_inner) -> Dict[str, Any]:
        frac, busy = self._frac(tasks)
        t = {self.key_tile: dv_tile * frac / _core_bw(self.dev, self.outer, busy)}
        if self.key_inner:
            t[self.key_inner] = dv_inner * frac / _core_bw(self.dev, self.lv.tile, busy)
        if self.key_dram:
            last = len(self.dev.levels) - 1
            t[self.key_dram] = self.compulsory * frac / _core_bw(self.dev, last, busy)
        if self.include_compute:
            t["compute"] = self.flops * frac / self.peak
        return t

    def score(self, dv_tile, tasks, tiles, mu):
        t = self.terms(dv_tile, tasks, self.inner_volume(tiles))
        vals = list(t.values())
        worst = vals[0]
        for v in vals[1:]:
            worst = np.maximum(worst, v)
        # among near-equal times prefer less traffic: a tenth of every movement term is added
        moved = 0
        for k, v in t.items():
            if k != "compute":
                moved = moved + v
        return worst + _TRAFFIC_WEIGHT * moved


def _least_volume(dv, tasks, tiles, mu):
    return dv - 1e-6 * mu  # Chimera's objective; among equal volumes the largest blocks


@dataclass
class _Nest:
    best: _Best
    tiles: Dict[str, int]
    inner: List[Dict[str, Any]]
    terms: Dict[str, float]
    levels: Dict[str, int]
    compute_s: float

    @property
    def volume(self) -> int:
        return int(sum(self.best.dm.values()))

    @property
    def time_s(self) -> float:
        return max(self.terms.values())

    @property
    def bound(self) -> str:
        return max(self.terms, key=self.terms.get)


def _run_nest(p: _Problem, cap: float, timer: _Timer, loops: Sequence[str],
              objective: str = "time") -> _Nest:
    best = _search(p, cap, timer.score if objective == "time" else _least_volume)
    ext = timer.extents
    tiles = {d: int(best.tiles.get(d, ext[d])) for d in loops}
    full = {**ext, **tiles}
    inner = [_inner_info(i, ext, full) for i in timer.inner]
    v_in = sum(i["volume"] for i in inner)
    terms = {k: float(v) for k, v in timer.terms(float(sum(best.dm.values())),
                                                 best.tasks, v_in).items()}
    levels = {timer.key_tile: int(sum(best.dm.values()))}
    if timer.key_inner:
        levels[timer.key_inner] = int(v_in)
    if timer.key_dram:
        levels[timer.key_dram] = int(timer.compulsory)
    return _Nest(best, tiles, inner, terms, levels, float(timer.compute(best.tasks)))


# ------------------------------------------------------------------------------------------------
# planning
# ------------------------------------------------------------------------------------------------
@dataclass
class ChainPlan:
    """Result of :func:`plan_chain`; every field is plain JSON data (``to_dict``/``from_dict``).

    Bytes and seconds. ``order``/``tiles``/``volume_*``/``time_*`` describe the plans with the
    least predicted time (parallelism included); ``least_*`` the plans with the least volume into
    the tile level (Chimera's own objective, parallelism ignored). ``volume_*``: per tensor, into
    the tile level (``tile_level``) from the outer level (Chimera's DM; unfused sums both ops).
    ``level_volume_*``/``terms_*`` are keyed by boundary ("L2<-L3": moved into L2, read from
    L3) and, when ``include_compute``, "compute"."""

    chain: Dict[str, Any]
    device: str
    tile_level: str
    tile_capacity_bytes: int  # usable capacity per core the tiles were sized for
    outer_level: str  # where the fused tiles stream from
    order: List[str]  # fused block order, outermost first (loops of extent 1 last)
    tiles: Dict[str, int]  # fused tile size per loop
    memory_usage_bytes: int  # fused MU
    tasks: int  # fused parallel tasks
    inner: List[Dict[str, Any]]  # per op: its fused block re-tiled for the inner level
    volume_fused: Dict[str, int]
    volume_unfused: Dict[str, int]
    total_fused: int
    total_unfused: int
    level_volume_fused: Dict[str, int]
    level_volume_unfused: Dict[str, int]
    terms_fused: Dict[str, float]
    terms_unfused: Dict[str, float]  # per-term sums over the unfused ops
    time_fused_s: float  # largest term
    time_unfused_s: float  # sum over the ops of each op's largest term
    compute_fused_s: float  # ideal-peak compute time (a term only when include_compute)
    compute_unfused_s: float
    bound_fused: str
    unfused_ops: List[Dict[str, Any]]  # per op: order, tiles, tasks, volumes, terms, time
    least_order: List[str]  # fused order/tiles/volumes with the least volume (Chimera)
    least_tiles: Dict[str, int]
    least_volume_fused: Dict[str, int]
    least_volume_unfused: Dict[str, int]
    least_total_fused: int
    least_total_unfused: int
    intermediates: List[Dict[str, Any]]  # name, shape, dtype, bytes, fits_tile_level
    include_compute: bool
    fuse: bool
    reason: str
    plan_s: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ChainPlan":
        return cls(**d)


def _fmt_bytes(b: float) -> str:
    b = float(b)
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b / s:.3g} {unit}"
    return f"{b:.0f} B"


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def _saving(fused: float, unfused: float) -> str:
    if not unfused:
        return "n/a"
    s = 1 - fused / unfused
    return f"saves {s:.0%}" if s >= 0 else f"{-s:.0%} more"


def plan_chain(chain: Chain, dev, *, fill: Optional[float] = None,
               tile_level: Optional[str] = None, include_compute: bool = True) -> ChainPlan:
    """Plan ``chain`` on ``dev`` (a ``tvm_roller.hardware.DeviceModel``, duck-typed): the best
    fused order and tiles, the unfused baseline (each op alone, one after the other), and whether
    to fuse (fused time < 0.95 x unfused time).

    ``fill``: usable fraction of each cache level (default 0.5 on a CPU, 1.0 on a GPU);
    ``tile_level``: name of the level the fused blocks are sized for (default: the largest
    private level); ``include_compute``: add the ideal-peak compute time as a term of every
    nest's time (default off: the time is Chimera's ``max_d DV_d / bw_d``; the compute time is
    reported either way)."""
    t0 = time.perf_counter()
    chain.validate()
    s = _setup(chain, dev, fill, tile_level, include_compute)
    fp = _plan_fused(chain, dev, s)
    fused, least_f, all_loops = fp.best, fp.least, s.all_loops
    inter_info = _intermediate_info(chain, s)
    un = _plan_unfused(chain, dev, s, inter_info)
    fuse = bool(s.multi and fused.time_s < FUSE_THRESHOLD * un.time_s)
    reason = _reason(dev, s, fp, un, inter_info, fuse)

    return ChainPlan(
        chain=chain.to_dict(), device=getattr(dev, "name", str(dev)), tile_level=s.tile_name,
        tile_capacity_bytes=int(s.cap), outer_level=s.names[fp.outer],
        order=list(fused.best.order) + [d for d in all_loops if d not in fused.best.order],
        tiles=_complete_tiles(chain, fused.tiles), memory_usage_bytes=int(fused.best.mu),
        tasks=int(fused.best.tasks), inner=fused.inner,
        volume_fused=dict(fused.best.dm), volume_unfused=un.volume, total_fused=fused.volume,
        total_unfused=int(sum(un.volume.values())), level_volume_fused=fused.levels,
        level_volume_unfused=un.levels, terms_fused=fused.terms, terms_unfused=un.terms,
        time_fused_s=fused.time_s, time_unfused_s=float(un.time_s),
        compute_fused_s=fused.compute_s, compute_unfused_s=float(un.compute_s),
        bound_fused=fused.bound, unfused_ops=un.ops,
        least_order=list(least_f.best.order) + [d for d in all_loops
                                                if d not in least_f.best.order],
        least_tiles=_complete_tiles(chain, least_f.tiles),
        least_volume_fused=dict(least_f.best.dm), least_volume_unfused=un.least,
        least_total_fused=least_f.volume, least_total_unfused=int(sum(un.least.values())),
        intermediates=inter_info, include_compute=include_compute, fuse=fuse, reason=reason,
        plan_s=time.perf_counter() - t0)


@dataclass(frozen=True)
class _Setup:
    """What every step of :func:`plan_chain` reads: the levels, the extents, the usable
    capacity of the tile level, the chain's tensors and each op's inner-level tiling."""

    lv: _Levels
    names: List[str]  # the device's levels, fastest first
    ext: Dict[str, int]
    all_loops: List[str]
    dtype: str
    cap: float  # usable bytes of the tile level per core
    line: int  # the tile level's line bytes
    inter: List[TensorUse]
    inter_names: List[str]
    io_bytes: int  # the chain's inputs and outputs
    multi: bool  # more than one op
    inner: Dict[str, Optional[_Inner]]  # by op name
    include_compute: bool

    @property
    def tile_name(self) -> str:
        return self.names[self.lv.tile]


def _setup(chain: Chain, dev, fill: Optional[float], tile_level: Optional[str],
           include_compute: bool) -> _Setup:
    lv = _levels(dev, fill, tile_level)
    names = [x.name for x in dev.levels]
    ext = chain.extents()
    all_loops = [lp.name for lp in chain.loops]
    dtype = _dtype(chain)
    cap = lv.usable(dev, lv.tile)
    line = dev.levels[lv.tile].line_bytes
    inter = chain.intermediates()
    inter_names = [t.name for t in inter]
    io_bytes = sum(chain.tensor_bytes(t.name) for t in chain.tensors if t.role != "intermediate")
    multi = len(chain.ops) > 1
    inner = {op.name: _inner_tiling(chain, dev, lv, op) for op in chain.ops}
    return _Setup(lv, names, ext, all_loops, dtype, cap, line, inter, inter_names, io_bytes,
                  multi, inner, include_compute)


@dataclass(frozen=True)
class _FusedPlans:
    problem: _Problem
    outer: int  # the level the fused tiles stream from
    best: _Nest  # least predicted time
    least: _Nest  # least volume (Chimera)


def _plan_fused(chain: Chain, dev, s: _Setup) -> _FusedPlans:
    # -- fused -----------------------------------------------------------------------------------
    pf = _fused_problem(chain, line_bytes=s.line)
    outer_f = _outer_index(dev, s.lv.tile, s.io_bytes)
    timer_f = _Timer(dev, s.lv, outer_f, s.io_bytes, chain.flops(), s.dtype, s.include_compute,
                     list(s.inner.values()), s.ext)
    fused = _run_nest(pf, s.cap, timer_f, s.all_loops)
    least_f = _run_nest(pf, s.cap, timer_f, s.all_loops, "volume")
    return _FusedPlans(pf, outer_f, fused, least_f)


def _intermediate_info(chain: Chain, s: _Setup) -> List[Dict[str, Any]]:
    inter_info = []
    for t in s.inter:
        size = chain.tensor_bytes(t.name)
        inter_info.append({"name": t.name, "shape": {d: s.ext[d] for d in t.loops},
                           "dtype": t.dtype_name, "bytes": int(size),
                           "fits_tile_level": bool(size <= s.cap)})
    return inter_info


@dataclass
class _Unfused:
    """The unfused baseline: each op's plans, and their volumes, terms and times summed over
    the ops (one after the other)."""

    ops: List[Dict[str, Any]] = field(default_factory=list)
    volume: Dict[str, int] = field(default_factory=dict)
    least: Dict[str, int] = field(default_factory=dict)
    levels: Dict[str, int] = field(default_factory=dict)
    terms: Dict[str, float] = field(default_factory=dict)
    time_s: float = 0.0
    compute_s: float = 0.0


def _plan_unfused(chain: Chain, dev, s: _Setup,
                  inter_info: Sequence[Dict[str, Any]]) -> _Unfused:
    # -- unfused: each op alone ------------------------------------------------------------------
    free_u = [i["name"] for i in inter_info if i["fits_tile_level"]]
    un = _Unfused()
    for op in chain.ops:
        _plan_unfused_op(chain, dev, s, op, free_u, un)
    return un


def _plan_unfused_op(chain: Chain, dev, s: _Setup, op: Op, free_u: Sequence[str],
                     un: _Unfused) -> None:
    """Plan ``op`` alone and add its plans to ``un``."""
    pu = _problem(chain, [op], s.ext, free_u, s.line)
    foot = sum(chain.tensor_bytes(tn) for tn in op.tensors)
    outer_u = _outer_index(dev, s.lv.tile, foot)
    comp = sum(chain.tensor_bytes(tn) for tn in op.tensors if tn not in s.inter_names)
    timer_u = _Timer(dev, s.lv, outer_u, comp, chain.op_flops(op), s.dtype, s.include_compute,
                     [s.inner[op.name]], s.ext)
    nest = _run_nest(pu, s.cap, timer_u, op.loops)
    least = _run_nest(pu, s.cap, timer_u, op.loops, "volume")
    un.time_s += nest.time_s
    un.compute_s += nest.compute_s
    for k, v in nest.terms.items():
        un.terms[k] = un.terms.get(k, 0.0) + v
    for k, v in nest.levels.items():
        un.levels[k] = un.levels.get(k, 0) + v
    for tn, v in nest.best.dm.items():
        un.volume[tn] = un.volume.get(tn, 0) + int(v)
    for tn, v in least.best.dm.items():
        un.least[tn] = un.least.get(tn, 0) + int(v)
    un.ops.append({
        "op": op.name, "order": list(nest.best.order), "tiles": nest.tiles,
        "tasks": int(nest.best.tasks), "memory_usage_bytes": int(nest.best.mu),
        "outer_level": s.names[outer_u], "volume": dict(nest.best.dm),
        "level_volume": nest.levels, "terms": nest.terms, "time_s": nest.time_s,
        "compute_s": nest.compute_s, "bound": nest.bound, "inner": nest.inner,
        "least_order": list(least.best.order), "least_tiles": least.tiles,
        "least_volume": dict(least.best.dm)})


def _reason(dev, s: _Setup, fp: _FusedPlans, un: _Unfused,
            inter_info: Sequence[Dict[str, Any]], fuse: bool) -> str:
    # -- reason ----------------------------------------------------------------------------------
    fused, least_f, tile_name, cap = fp.best, fp.least, s.tile_name, s.cap
    time_u, compute_u, vol_u = un.time_s, un.compute_s, un.volume
    parts = []
    for i in inter_info:
        dims = [v for v in i["shape"].values() if v > 1] or [1]
        shape = "x".join(str(v) for v in dims)
        parts.append(f"intermediate {i['name']} {shape} {i['dtype']} ({_fmt_bytes(i['bytes'])}) "
                     f"{'fits' if i['fits_tile_level'] else 'does not fit'} {tile_name} "
                     f"({_fmt_bytes(cap)} usable per core)")
    par_f = []
    for d in fused.best.order:
        if d not in fp.problem.parallel:
            break
        par_f.append(d)
    if not s.multi:
        parts.append("single op: nothing to fuse")
    else:
        lt_f, lt_u = least_f.volume, sum(un.least.values())
        parts.append(f"least traffic into {tile_name}: fused {_fmt_bytes(lt_f)} vs unfused "
                     f"{_fmt_bytes(lt_u)} ({_saving(lt_f, lt_u)})")
        parts.append(f"best plans on {dev.num_units} cores: fused {_fmt_bytes(fused.volume)} in "
                     f"{_fmt_s(fused.time_s)} ({fused.best.tasks} tasks over "
                     f"{','.join(par_f) or 'nothing'}, bound by {fused.bound}) "
                     f"vs unfused {_fmt_bytes(sum(vol_u.values()))} in {_fmt_s(time_u)} "
                     f"({_saving(fused.volume, sum(vol_u.values()))} of {tile_name} traffic)")
        if not s.include_compute:
            worst_f = max(fused.terms.values())
            if fused.compute_s > worst_f or compute_u > time_u:
                parts.append(f"note: ideal-peak compute ({_fmt_s(fused.compute_s)} fused, "
                             f"{_fmt_s(compute_u)} unfused) exceeds data movement: the chain is "
                             f"compute-bound and fusion may gain less")
        gain = 1 - fused.time_s / time_u if time_u else 0.0
        parts.append(f"fuse: {gain:.0%} faster" if fuse else
                     f"do not fuse: predicted gain {gain:.0%} < {1 - FUSE_THRESHOLD:.0%}")
    return "; ".join(parts)


def format_plan(plan: ChainPlan) -> str:
    """Lines for ``tvm_roller.explain``: decision, order, tiles, volumes per tensor and level."""
    roles = {t["name"]: t["role"] for t in plan.chain["tensors"]}
    ext = {lp["name"]: lp["extent"] for lp in plan.chain["loops"]}

    def loops(order):
        return " ".join(d for d in order if ext[d] > 1)

    def tiles(t, order):
        return ", ".join(f"{d}={t[d]}/{ext[d]}" for d in order if d in t and ext[d] > 1)

    lines = [f"chain {plan.chain.get('name') or ''}: {'FUSE' if plan.fuse else 'do not fuse'} "
             f"(Chimera data-movement model, {plan.device})",
             f"  reason: {plan.reason}",
             f"  fused blocks sized for {plan.tile_level} ({_fmt_bytes(plan.tile_capacity_bytes)} "
             f"usable per core, MU {_fmt_bytes(plan.memory_usage_bytes)}), streamed from "
             f"{plan.outer_level}; {plan.tasks} parallel tasks",
             f"  fused order (outer->inner): {loops(plan.order)}; tiles "
             f"{tiles(plan.tiles, plan.order)}"]
    for info in plan.inner:
        lines.append(f"    {info['op']} block re-tiled for {info['level']}: order "
                     f"{loops(info['order'])}; tiles {tiles(info['tiles'], info['order'])}")
    for u in plan.unfused_ops:
        lines.append(f"  unfused {u['op']}: order {loops(u['order'])}; tiles "
                     f"{tiles(u['tiles'], u['order'])}; {u['tasks']} tasks, {_fmt_s(u['time_s'])} "
                     f"(bound by {u['bound']})")
    lines.append(f"  least-traffic fused order: {loops(plan.least_order)}; tiles "
                 f"{tiles(plan.least_tiles, plan.least_order)}")
    lines.append(f"  volume into {plan.tile_level} per tensor: best fused | best unfused || "
                 f"least fused | least unfused")
    for name in plan.volume_unfused:
        lines.append(f"    {name:<6s} {roles.get(name, ''):<12s} "
                     f"{_fmt_bytes(plan.volume_fused.get(name, 0)):>10s} | "
                     f"{_fmt_bytes(plan.volume_unfused[name]):>10s} || "
                     f"{_fmt_bytes(plan.least_volume_fused.get(name, 0)):>10s} | "
                     f"{_fmt_bytes(plan.least_volume_unfused.get(name, 0)):>10s}")
    lines.append(f"    {'total':<19s} {_fmt_bytes(plan.total_fused):>10s} | "
                 f"{_fmt_bytes(plan.total_unfused):>10s} || "
                 f"{_fmt_bytes(plan.least_total_fused):>10s} | "
                 f"{_fmt_bytes(plan.least_total_unfused):>10s}")
    keys = list(dict.fromkeys(list(plan.terms_fused) + list(plan.terms_unfused)))
    lines.append("  per level, fused | unfused:")
    for k in keys:
        if k == "compute":
            continue
        lines.append(f"    {k:<10s} {_fmt_bytes(plan.level_volume_fused.get(k, 0)):>10s} "
                     f"{_fmt_s(plan.terms_fused.get(k, 0.0)):>9s} | "
                     f"{_fmt_bytes(plan.level_volume_unfused.get(k, 0)):>10s} "
                     f"{_fmt_s(plan.terms_unfused.get(k, 0.0)):>9s}")
    lines.append(f"    {'compute':<10s} {_fmt_s(plan.compute_fused_s):>21s} | "
                 f"{_fmt_s(plan.compute_unfused_s):>20s}"
                 + ("" if plan.include_compute else "  (not a term)"))
    lines.append(f"  predicted: fused {_fmt_s(plan.time_fused_s)} (bound by {plan.bound_fused}), "
                 f"unfused {_fmt_s(plan.time_unfused_s)}")
    return "\n".join(lines)
