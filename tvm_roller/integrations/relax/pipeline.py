"""The Relax pipeline with roller: TVM's default one for the target, roller's passes added.

    ex = tvm.compile(mod, target=target, relax_pipeline=tvm_roller.relax.get_pipeline(target, report))

It is TVM's default pipeline for the target (library dispatch, legalization, fusion, dataflow
lowering, finalization) with passes added before legalization (rewrites around TVM defects,
inference simplifications, elementwise ops moved before reshapes (they then fuse into the
matmul before them), shapes simplified under the shape variables' bounds, convolution
layouts, matmul chains grouped for fusion: ``passes/``) and one after fusion in which roller
schedules each fused PrimFunc (``passes.schedule``: a declined or failing function keeps TVM's
default treatment, so one function never fails the model's compile), with the constant weights
its kernels read packed around it (``passes.prepack``). On a CUDA target TVM's
default treatment is its dlight rules, which then see only what roller left.
"""
from __future__ import annotations

from typing import Optional

import tvm
from tvm import relax

from tvm_roller.hardware import DeviceModel
from tvm_roller.integrations.relax.passes import fast_math as fm
from tvm_roller.integrations.relax.passes.accumulate_f32 import accumulate_f32_pass
from tvm_roller.integrations.relax.passes.conv_gemm import conv_gemm_pass
from tvm_roller.integrations.relax.passes.conv_layout import conv_layout_pass
from tvm_roller.integrations.relax.passes.flash_attention import flash_attention_pass
from tvm_roller.integrations.relax.passes.group_chains import group_chains_pass
from tvm_roller.integrations.relax.passes.inference import inference_pass
from tvm_roller.integrations.relax.passes.norms_in_dtype import norms_in_dtype_pass
from tvm_roller.integrations.relax.passes.prepack import fold_packing, mark_constant_operands
from tvm_roller.integrations.relax.passes.schedule import relax_context, schedule_pass
from tvm_roller.integrations.relax.passes.shape_bounds import bound_shapes_pass
from tvm_roller.integrations.relax.passes.shape_reads import shape_reads_pass
from tvm_roller.integrations.relax.passes.sink_reshape import sink_reshape_pass
from tvm_roller.integrations.relax.passes.workarounds import workarounds_pass
from tvm_roller.planner import UNSET


def fusion_passes(fast_math: bool = True, gemm_chains: bool = True,
                  device: Optional[DeviceModel] = None,
                  chains: Optional[list] = None,
                  conv_layouts: Optional[dict] = None,
                  report: Optional[list] = None) -> tvm.transform.Pass:
    """Legalize and fuse the way roller's pipeline does (elementwise epilogues join their producer).

    MetaSchedule tasks extracted from ``fusion_passes()(mod)`` are exactly the PrimFuncs the roller
    pipeline schedules, so records written for them apply to what the pipeline builds.
    ``fast_math`` swaps exp/tanh for TVM's polynomial versions (``FastMathTransform``) and erf /
    GELU for roller's rational erf (:mod:`passes.fast_math`): these vectorize, while LLVM's
    scalar libm calls otherwise bound softmax and GELU. Errors stay below 1e-6.
    ``conv_layouts``: see :func:`conv_layout_pass` (``{}`` keeps the model's layouts).
    ``report`` gets an entry for each kernel built whole here (flash attention)."""
    fast = [relax.transform.FastMathTransform()] if fast_math else []
    # attentions become flash-attention kernels on a CPU (while their softmax is still one:
    # before the fast math makes it a kernel); the other matmul -> ... -> matmul chains one
    # PrimFunc each (Chimera; see tvm_roller.fusion)
    flash = [relax.transform.FoldConstant(), flash_attention_pass(device, report, chains)] \
        if gemm_chains else []
    group = [relax.transform.FoldConstant(), group_chains_pass(device, chains)] \
        if gemm_chains else []
    # (reshapes sink after the convolutions become GEMMs: each GEMM ends in one)
    return tvm.transform.Sequential([bound_shapes_pass(), workarounds_pass(), inference_pass(),
                                     conv_layout_pass(conv_layouts), conv_gemm_pass(),
                                     sink_reshape_pass(),
                                     accumulate_f32_pass(), norms_in_dtype_pass()]
                                    + flash + fast + group + [
        relax.transform.LegalizeOps(fm.legalize_map() if fast_math else None),
        bound_shapes_pass(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        # a lone reshape becomes a view now, before roller would schedule it as a copy (TVM's
        # dataflow lowering recognises only unscheduled reshapes)
        relax.transform.RewriteDataflowReshape(),
        relax.transform.DeadCodeElimination(),
    ], name="RollerFusion")


def get_pipeline(target, report: Optional[list] = None, device: Optional[DeviceModel] = None,
                 cache=UNSET, progress=UNSET, fast_math=UNSET, chains: Optional[list] = None,
                 fuse_chains=UNSET, conv_layouts=UNSET, buckets=UNSET, verify=UNSET,
                 measure_topk=UNSET, check: bool = True) -> tvm.transform.Pass:
    """TVM's default Relax pipeline for ``target`` with roller scheduling every fused PrimFunc.

    Usable as ``tvm.compile(mod, target=target, relax_pipeline=get_pipeline(target))``.
    ``target``: a target or the planner's :class:`~tvm_roller.planner.Context`, whose options
    the pipeline reads; an option given here changes the Context's (a target: see the
    defaults below). When ``report`` is a list, one entry (a dict, see
    :class:`~tvm_roller.planner.FuncReport`) per PrimFunc is appended. ``cache``: the
    persistent schedule cache (True, the default: the default one; False: none; or a
    :class:`~tvm_roller.cache.ScheduleCache`). ``fast_math`` (default True): see
    :func:`fusion_passes`. ``chains`` (a list) gets one dict per matmul chain found: fused or
    kept apart, and why; ``fuse_chains=False`` turns the matmul-chain fusion off;
    ``conv_layouts``: the layouts convolutions are converted to (None: the backend's
    ``conv_layouts``; ``{}``: keep the model's); ``buckets``, ``verify``, ``measure_topk``,
    ``progress``, ``check``: see :func:`schedule_pass`."""
    ctx = relax_context(target, device, cache=cache, progress=progress, fast_math=fast_math,
                        fuse_chains=fuse_chains, conv_layouts=conv_layouts, buckets=buckets,
                        verify=verify, measure_topk=measure_topk)
    roller = schedule_pass(ctx, report, check=check)

    @tvm.transform.module_pass(opt_level=0, name="RollerPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        tgt = ctx.target
        stages = ctx.backend.relax_stages()
        with tgt:
            seq = tvm.transform.Sequential(
                # before DispatchSortScan legalizes the scans (it needs their shapes)
                [bound_shapes_pass(), workarounds_pass(), shape_reads_pass()]
                + stages.library_dispatch_passes(tgt)
                + [fusion_passes(ctx.fast_math, ctx.fuse_chains, ctx.device,
                                 chains, ctx.conv_layouts, report),
                   mark_constant_operands(), roller, fold_packing(report)]
                + ctx.backend.fallback_passes(tgt)
                + stages.dataflow_lower_passes(tgt)
                + stages.finalize_passes(tgt))
            return seq(mod)

    return _pipeline
