"""The CPU backend: LLVM targets, device models from the target and the host."""
from __future__ import annotations

import dataclasses
import types

import tvm
from tvm import tirx

from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.backends.base import Backend
from tvm_roller.backends.cpu.microkernel import OPERAND_DTYPES
from tvm_roller.backends.cpu.rules import RULES
from tvm_roller.backends.cpu.rules.chain import CpuChainRule
from tvm_roller.backends.vector_math import rewrite_vector_math, vector_math_pass
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.backends.cpu.microkernel.calibrate import with_route_rates
from tvm_roller.hardware.calibrate import auto_calibration_enabled
from tvm_roller.hardware.calibrate import device_model as measured_device_model
from tvm_roller.hardware.model import DeviceModel


class CpuBackend(Backend):
    name = "cpu"
    # channels innermost (NHWC / NWC, weights HWIO / WIO) so the output channels are the vector
    # axis with unit-stride weights for every window, stride and group count (docs/history.md,
    # "Real models"). PyTorch's NCHW weights are constants: their transposes fold at compile
    # time; ConvertLayout carries the activations' layout through elementwise ops and pooling.
    # A transposed convolution stays NCHW: LegalizeOps lowers conv2d_transpose in NCHW only
    # (ConvertLayout would otherwise carry a producer's NHWC into it and VM codegen fails)
    conv_layouts = {"relax.nn.conv1d": ["NWC", "WIO"], "relax.nn.conv2d": ["NHWC", "HWIO"],
                    "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}
    traceable_chains = True
    flash_attention = True  # backends/cpu/flash_attention.py
    splits_tails = True  # the tiled lowering pads (pad_einsum); convolutions keep exact tiles
    operand_dtypes = OPERAND_DTYPES
    runner_device = "cpu"
    tuning_kind = "llvm"

    def __init__(self) -> None:
        rules = tuple(rule() for rule in RULES)
        super().__init__(rules, CpuChainRule(rules))

    def analyze(self, func) -> FuncAnalysis:
        """The analysis of ``func``, whose function (what every rule lowers) has its float32
        exp / erf / tanh / sigmoid calls as vector polynomials (``vector_math``): LLVM would
        call scalar libm per element. The analysis itself is of the function as given."""
        fa = super().analyze(func)
        return dataclasses.replace(fa, func=self.scheduling_form(fa.func))

    def scheduling_form(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        return rewrite_vector_math(func)

    def fallback_passes(self, target: tvm.target.Target) -> list:
        """What roller declines stays unscheduled, with the same vector math."""
        return [vector_math_pass()]

    def device_model(self, target: tvm.target.Target) -> DeviceModel:
        """The calibrated (or estimated) model, with its micro-kernel routes' rates measured
        where this host runs them and calibration on first use is on (else the presets)."""
        return with_route_rates(target, measured_device_model(target),
                                measure=auto_calibration_enabled())

    def check_device(self, target: tvm.target.Target, dev: DeviceModel) -> list:
        if dev.kind != "cpu":
            raise UnsupportedError(f"device {dev.name!r} is a {dev.kind}, the target is "
                                   f"{target.kind.name}")
        return []

    def describe_device(self, dev: DeviceModel) -> str:
        table = dev.cpu.tile_gflops if dev.cpu else None
        rates = (f"; compute rate per register tile measured ({len(table)} tiles)" if table
                 else "; compute rate per register tile estimated (FMA latency and load ports)")
        routes = dev.cpu.route_gops if dev.cpu else None
        rates += (f"; micro-kernel routes measured ({len(routes)} blocks)" if routes
                  else "; micro-kernel routes at their presets")
        return (f"device: {dev.name} ({dev.source}), {dev.num_units} units, "
                f"{dev.simd_bytes * 8}-bit SIMD, {dev.num_vector_registers} vector regs{rates}")

    def relax_stages(self) -> types.ModuleType:
        # (relax.pipeline.dataflow_lower_passes would dispatch, but in 0.27 it looks the
        # function up on the backend package, which does not export it)
        from tvm.relax.backend.cpu_generic import pipeline

        return pipeline
