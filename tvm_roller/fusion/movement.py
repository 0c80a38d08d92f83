"""Analytical data-movement model for fused chains of compute-intensive operators (Chimera).

Chimera (Zheng et al., HPCA'23; shared/papers.md section 2.1) splits a chain such as
``C = A.B; E = C.D`` into computation blocks, keeps the intermediate ``C`` on chip, and chooses the
block execution order and the block (tile) sizes that minimise the data moved between memory
levels. This module is the public face of that model, generalised to any chain described by its
loops and index sets, plus the unfused baseline and the decision whether to fuse. The model is
plain Python (math, itertools, numpy); it never imports TVM, so a chain can be planned from a
description built anywhere.

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

Where things are (modules of ``tvm_roller.fusion``): ``chain_spec`` (the input description),
``chain_builders`` (``gemm_chain``, ``mlp_chain``, ``conv_chain``), ``tile_sizes`` (the ladder),
``problem`` (the model on one nest), ``tile_search`` (the search), ``chain_volume``
(``data_movement``, ``memory_usage``), ``levels``, ``inner_tiling`` and ``timing`` (the time of a
nest), ``planning`` (``plan_chain``), ``chain_plan`` (its result) and ``plan_format``
(``format_plan``).
"""

from tvm_roller.fusion.chain_builders import conv_chain, gemm_chain, mlp_chain
from tvm_roller.fusion.chain_plan import ChainPlan
from tvm_roller.fusion.chain_spec import Chain, Loop, Op, TensorUse
from tvm_roller.fusion.chain_volume import data_movement, memory_usage
from tvm_roller.fusion.plan_format import format_plan
from tvm_roller.fusion.planning import FUSE_THRESHOLD, plan_chain
from tvm_roller.fusion.tile_sizes import MAX_PADDING_WASTE, tile_candidates

__all__ = [
    "Loop", "TensorUse", "Op", "Chain", "ChainPlan", "plan_chain", "format_plan",
    "data_movement", "memory_usage", "tile_candidates", "gemm_chain", "mlp_chain", "conv_chain",
    "FUSE_THRESHOLD", "MAX_PADDING_WASTE",
]
