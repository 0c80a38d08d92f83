"""The backend interface: what a target family (CPU, CUDA, ...) gives the planner.

A :class:`Backend` turns a target into a device model, checks the pair, names its compile
configuration and Relax stages, and holds its :class:`OpRule` list (one rule per op class:
tiled GEMM-like, convolution, streaming reductions / elementwise, ...) and its
:class:`ChainRule` (Chimera's GEMM -> GEMM fusion). The planner picks the first rule whose
``matches`` accepts the analysed function; every rule constructs, validates, lowers and describes
the rTiles of its class. Lowering never mutates the tile, the analysis or the plan.
"""
from __future__ import annotations

import types
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tvm
from tvm import s_tir, tirx

from tvm_roller.analysis.func import SUPPORTED_DTYPES, FuncAnalysis, analyze
from tvm_roller.core.errors import InvalidTile, UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.fusion.chain import GemmChain
from tvm_roller.fusion.decision import ChainDecision
from tvm_roller.hardware.model import DeviceModel


class OpRule(ABC):
    """One op class of one backend: which functions it takes and how it builds their kernels."""

    #: the rule's name in reports and errors
    name: str = ""

    @abstractmethod
    def matches(self, fa: FuncAnalysis) -> bool:
        """Whether this rule schedules the analysed function."""

    @abstractmethod
    def tile_kind(self, fa: FuncAnalysis) -> str:
        """The ``RTile.kind`` of this rule's tiles for ``fa`` (tiled / reduction / elementwise)."""

    @abstractmethod
    def construct(self, fa: FuncAnalysis, dev: DeviceModel, topk: int) -> List[RTile]:
        """The top-``topk`` rTiles, best first (deterministic)."""

    @abstractmethod
    def lower(self, func: tirx.PrimFunc, fa: FuncAnalysis, tile: RTile,
              dev: DeviceModel, traceable: bool = False) -> s_tir.Schedule:
        """``tile`` applied to ``func``: a schedule (``tile`` and ``fa`` stay unchanged).
        ``traceable``: the schedule's trace must replay on ``func`` itself (MetaSchedule
        records, bucket traces), so no rewrite of the function before scheduling."""

    def validate(self, tile: RTile, fa: FuncAnalysis, dev: DeviceModel) -> None:
        """Raise InvalidTile unless ``tile`` (e.g. from a cache) fits ``fa`` as this rule's
        lowering needs it. Not a style check: a register tile larger than its L1 tile makes a
        split factor 0, which crashes TVM natively (SIGFPE) instead of raising."""
        tile.check_shape()
        kind = self.tile_kind(fa)
        if tile.kind != kind:
            raise InvalidTile(f"tile kind {tile.kind} != {kind} ({self.name}'s kind of this "
                              "function)")
        if tile.extents != [a.extent for a in fa.axes]:
            raise InvalidTile(f"tile extents {tile.extents} != function extents "
                              f"{[a.extent for a in fa.axes]}")
        if tile.axis_kinds != "".join(a.kind for a in fa.axes):
            raise InvalidTile("tile axis kinds differ from the function's")
        if tile.vector_axis != fa.vector_axis:
            raise InvalidTile(f"tile vector axis {tile.vector_axis} != function's "
                              f"{fa.vector_axis}")

    def describe(self, tile: RTile) -> List[str]:
        """Lines for ``explain`` about one of this rule's tiles (after its prediction line)."""
        return []


class TiledOpRule(OpRule):
    """The tiled (reuse-heavy) class every backend has: nested register / cache (or block)
    tiles, the accumulator in registers or per task."""

    name = "tiled"

    def tile_kind(self, fa: FuncAnalysis) -> str:
        return "tiled"

    def tile_limit(self, extent: int, reg: int) -> int:
        """The largest tile along a spatial axis of ``extent`` with register tile ``reg`` (a
        larger one is predicated or padded by the lowering)."""
        return extent

    def validate(self, tile: RTile, fa: FuncAnalysis, dev: DeviceModel) -> None:
        """Also: reg <= l1 <= l2 <= extent on spatial axes, the reduction chunk at most the
        axis, the accumulator in registers or per task."""
        super().validate(tile, fa, dev)
        if tile.acc_level not in ("reg", "task"):
            raise InvalidTile(f"tile acc_level {tile.acc_level!r}")
        for i, a in enumerate(fa.axes):
            limit = self.tile_limit(a.extent, tile.reg[i])
            if a.kind == "S" and not tile.reg[i] <= tile.l1[i] <= tile.l2[i] <= limit:
                raise InvalidTile(f"axis {a.name}: tiles reg {tile.reg[i]} <= l1 {tile.l1[i]} "
                                  f"<= l2 {tile.l2[i]} <= {limit} (extent {a.extent}) do not "
                                  "hold")
            if a.kind == "R" and not tile.l1[i] <= a.extent:
                raise InvalidTile(f"axis {a.name}: reduction chunk {tile.l1[i]} > extent "
                                  f"{a.extent}")


class ChainRule(ABC):
    """A backend's GEMM -> GEMM fusion (Chimera): decide from the data-movement model, lower."""

    @abstractmethod
    def plan(self, chain: GemmChain, dev: DeviceModel,
             stage_kinds: Optional[Sequence[str]] = None) -> ChainDecision:
        """Fuse or not, the fused kernel's layout and why. ``stage_kinds``: the kinds of the
        stages between the matmuls when the chain is still a Relax graph (None: a PrimFunc)."""

    @abstractmethod
    def lower(self, func: tirx.PrimFunc, chain: GemmChain, decision: ChainDecision,
              dev: DeviceModel) -> s_tir.Schedule:
        """The fused kernel when ``decision.fuse``, else the operators as one traceable
        schedule of ``func`` (MetaSchedule records); UnsupportedError when it cannot."""


class Backend(ABC):
    """One target family. Subclasses set the class attributes and implement the methods."""

    #: the backend's name ("cpu", "cuda"): ``RTile.backend`` of its tiles
    name: str = ""
    #: the float dtypes its compute-bound kernels take (analysis; streaming adds integers)
    tiled_dtypes: Tuple[str, ...] = SUPPORTED_DTYPES
    #: low-precision operand dtypes its compute-bound kernels take (bf16, int8: a rule
    #: declines the function when the target lacks the product)
    operand_dtypes: Tuple[str, ...] = ()
    #: convolutions are converted to these layouts before scheduling (Relax op -> layouts)
    conv_layouts: Dict[str, List[str]] = {}
    #: PassContext config its kernels are compiled under
    pass_config: Dict[str, Any] = {}
    #: whether a GEMM chain left unfused has a one-function traceable schedule (MetaSchedule)
    traceable_chains: bool = False
    #: the device MetaSchedule's local runner measures on
    runner_device: str = "cpu"
    #: the target kind MetaSchedule's default mutators are created for
    tuning_kind: str = "llvm"
    #: whether the planner may rewrite a function into independent parts, each planned by
    #: these rules and stitched back (``analysis.parts``: a transposed convolution as one
    #: sub-convolution per output parity class)
    decomposes: bool = True
    #: whether a tail of an axis the register tile does not divide is planned as a part of its
    #: own (``analysis.vector_tail``, ``analysis.window_tail``): where the lowering pads to
    #: whole register tiles (zero-filled input copies) or keeps one-position tiles
    splits_tails: bool = False
    #: why this backend builds no bucket kernels for functions with symbolic extents
    #: (``planner.buckets``), or "" when it does
    no_dynamic_kernels: str = ""
    #: whether a model's attentions become whole flash-attention kernels before the chain
    #: fusion (``integrations.relax.passes.flash_attention``)
    flash_attention: bool = False

    def __init__(self, rules: Sequence[OpRule], chain_rule: Optional[ChainRule] = None) -> None:
        self._rules = tuple(rules)
        self._chain_rule = chain_rule

    @property
    def rules(self) -> Tuple[OpRule, ...]:
        """The op rules, tried in order: the first that matches schedules a function."""
        return self._rules

    @property
    def chain_rule(self) -> Optional[ChainRule]:
        """GEMM-chain fusion (None: chains are scheduled as their main block)."""
        return self._chain_rule

    @abstractmethod
    def device_model(self, target: tvm.target.Target) -> DeviceModel:
        """The device model of a normalised target of this family (no live device)."""

    def check_device(self, target: tvm.target.Target, dev: DeviceModel) -> List[str]:
        """Notes when ``dev`` is not exactly what ``target`` compiles for; UnsupportedError when
        code for ``target`` cannot run on ``dev``."""
        return []

    @abstractmethod
    def describe_device(self, dev: DeviceModel) -> str:
        """One line about the device for ``explain``."""

    @abstractmethod
    def relax_stages(self) -> types.ModuleType:
        """TVM's module of per-stage Relax pass lists for this family
        (``library_dispatch_passes``, ``dataflow_lower_passes``, ``finalize_passes``)."""

    def fallback_passes(self, target: tvm.target.Target) -> list:
        """Passes that schedule what roller declined (TVM's default treatment)."""
        return []

    def default_schedule(self, mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
        """TVM's default treatment of ``mod``'s functions (the fallback for a declined one)."""
        passes = self.fallback_passes(target)
        if not passes:
            return mod
        with target:
            return tvm.transform.Sequential(passes)(mod)

    def scheduling_form(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """The function as this backend's rules schedule it (the analysis's ``func``): a
        rewrite that keeps block names and loops, so a trace recorded on one specialisation
        replays on another (``planner.buckets``). Unchanged by default."""
        return func

    # -- derived -------------------------------------------------------------------------------
    def analyze(self, func) -> FuncAnalysis:
        """``analysis.analyze`` with this backend's dtypes."""
        return analyze(func, self.tiled_dtypes, self.operand_dtypes)

    def rule_for(self, fa: FuncAnalysis) -> OpRule:
        """The first rule that matches ``fa``; UnsupportedError when none does."""
        for rule in self.rules:
            if rule.matches(fa):
                return rule
        raise UnsupportedError(f"no {self.name} rule takes {fa.main} ({fa.kind}); rules: "
                               + ", ".join(r.name for r in self.rules))
