"""Compiling a tensor-core schedule: the TIR pipeline it needs, registered once per process, and
``build`` / ``lower_device_kernel`` under that pipeline and ``pass_config``.

Build the scheduled module (``tensorcore.apply_tensorcore(...).mod``) with
``build(mod, tile, target)``, or ``tvm.compile(mod, target, tir_pipeline=tir_pipeline(tile))``
under ``PassContext(config=pass_config(tile))``:

  * ``tirx.use_async_copy`` turns the pipelined shared-memory copies into cp.async (without it
    the pipeline still works, with synchronous copies);
  * the mma path keeps its register fragments in TVM "warp" buffers, which TVM 0.27's
    LowerWarpMemory lowers only one per statement sequence and not through CSE variables:
    ``tir_pipeline(tile)`` names a copy of TVM's "s_tir" pipeline that runs without CSE and
    repeats the pass (for every function of the module it compiles).
"""
from __future__ import annotations

from typing import Dict

from tvm_roller.backends.cuda.tensorcore_gemm import MMA
from tvm_roller.backends.cuda.tensorcore_intrinsics import REGISTRATION_LOCK
from tvm_roller.core.rtile import RTile

TIR_PIPELINE = "roller_s_tir"


def _lower_all_warp_memory():
    """TVM 0.27's LowerWarpMemory lowers only the first "warp" buffer of a statement sequence;
    the mma path has several (A, B and accumulator fragments, and the pipeline's copies): repeat
    it until nothing changes."""
    import tvm
    import tvm_ffi

    @tvm.transform.module_pass(opt_level=0, name="RollerLowerAllWarpMemory")
    def _pass(mod, _ctx):
        for _ in range(64):
            new = tvm.tirx.transform.LowerWarpMemory()(mod)
            if tvm_ffi.structural_equal(new, mod):
                return new
            mod = new
        return mod

    return _pass


def _register_pipeline() -> None:
    from tvm.tirx import compilation_pipeline as cp

    if TIR_PIPELINE in cp.PIPELINE_MAP:
        return

    def factory(**kwargs):
        import tvm

        pipeline, finalize_host, finalize_device = cp.get_tir_pipeline("s_tir", **kwargs)

        @tvm.transform.module_pass(opt_level=0, name="RollerSTirPipelineWithoutCSE")
        def pipeline_without_cse(mod, ctx):
            # CSE would hide the lane (threadIdx.x) of warp-buffer indices in let variables,
            # which TVM 0.27's LowerWarpMemory cannot see through
            config = dict(ctx.config)
            config["tirx.disable_cse_tir"] = True
            with tvm.transform.PassContext(opt_level=ctx.opt_level, config=config,
                                           required_pass=list(ctx.required_pass),
                                           disabled_pass=list(ctx.disabled_pass),
                                           instruments=list(ctx.instruments)):
                return pipeline(mod)

        def finalize_device_all_warps():
            return tvm.transform.Sequential([_lower_all_warp_memory(), finalize_device()])

        return pipeline_without_cse, finalize_host, finalize_device_all_warps

    with REGISTRATION_LOCK:
        if TIR_PIPELINE not in cp.PIPELINE_MAP:
            cp.register_tir_pipeline(TIR_PIPELINE, factory)


def tir_pipeline(tile: RTile) -> str:
    """The TIR pipeline to compile the schedule with (``tvm.compile(..., tir_pipeline=...)``,
    ``relax.build(..., tir_pipeline=...)``): TVM's default (the "s_tir" pipeline) for WMMA; for
    the mma path ``TIR_PIPELINE``: the same pipeline without CSE and with every warp buffer
    lowered to registers (TVM's default pipeline fails on, or keeps in local memory, all but
    one of them)."""
    if tile.tensor_core == MMA:
        _register_pipeline()
        return TIR_PIPELINE
    return "default"


def build(mod, tile: RTile, target):
    """``tvm.compile`` of a scheduled module (``apply_tensorcore(...).mod``) under
    ``pass_config(tile)`` and ``tir_pipeline(tile)``; returns the ``tvm.runtime.Executable``."""
    import tvm

    with tvm.transform.PassContext(config=pass_config(tile)):
        return tvm.compile(mod, target, tir_pipeline=tir_pipeline(tile))


def lower_device_kernel(mod, tile: RTile, target):
    """The lowered device kernel (``calling_conv`` 2) of a scheduled module, the function
    ``tvm.s_tir.analysis.verify_gpu_code`` checks; warp buffers already lowered. ``target``:
    a ``tvm.target.Target`` as the caller's Context holds it (normalised there, not here)."""
    import tvm

    if not isinstance(target, tvm.target.Target):
        raise TypeError(f"lower_device_kernel takes a normalised tvm.target.Target, got "
                        f"{type(target).__name__}")
    tgt = target
    from tvm.tirx import compilation_pipeline as cp

    with tvm.transform.PassContext(config=pass_config(tile)):
        pipeline, _, finalize_device = cp.get_tir_pipeline(tir_pipeline(tile))
        low = pipeline(tvm.tirx.transform.BindTarget(tgt.with_host("llvm"))(mod))
        kernels = [f for _, f in low.functions_items()
                   if f.attrs is not None and f.attrs.get("calling_conv") is not None
                   and int(f.attrs["calling_conv"]) == 2]
        if len(kernels) != 1:
            raise RuntimeError(f"expected one device kernel, got {len(kernels)}")
        dev = finalize_device()(tvm.IRModule({"kernel": kernels[0]}))
    return dev["kernel"]


def pass_config(tile: RTile) -> Dict[str, object]:
    """PassContext config to compile the schedule with: cp.async for a pipelined K loop (TVM 0.27
    emits cp.async for ``software_pipeline_async_stages`` even without it; kept for clarity)."""
    return {"tirx.use_async_copy": True} if tile.stages >= 2 else {}
