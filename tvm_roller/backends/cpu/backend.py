"""The CPU backend: LLVM targets, device models from the target and the host."""
from __future__ import annotations

import types

import tvm

from tvm_roller.backends.base import Backend
from tvm_roller.backends.cpu.rules.chain import CpuChainRule
from tvm_roller.backends.cpu.rules.conv import ConvRule
from tvm_roller.backends.cpu.rules.streaming import StreamingRule
from tvm_roller.backends.cpu.rules.tiled import TiledRule
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware import cpu as cpu_hw
from tvm_roller.hardware.model import DeviceModel


class CpuBackend(Backend):
    name = "cpu"
    # channels innermost (NHWC / NWC, weights HWIO / WIO) so the output channels are the vector
    # axis with unit-stride weights for every window, stride and group count (BENCHMARKS.md,
    # "Real models"). PyTorch's NCHW weights are constants: their transposes fold at compile
    # time; ConvertLayout carries the activations' layout through elementwise ops and pooling.
    conv_layouts = {"relax.nn.conv1d": ["NWC", "WIO"], "relax.nn.conv2d": ["NHWC", "HWIO"]}
    traceable_chains = True
    runner_device = "cpu"
    tuning_kind = "llvm"

    def __init__(self) -> None:
        # a convolution is tiled too: its rule comes first
        super().__init__((ConvRule(), TiledRule(), StreamingRule()), CpuChainRule())

    def device_model(self, target: tvm.target.Target) -> DeviceModel:
        return cpu_hw.from_target(target)

    def check_device(self, target: tvm.target.Target, dev: DeviceModel) -> list:
        if dev.kind != "cpu":
            raise UnsupportedError(f"device {dev.name!r} is a {dev.kind}, the target is "
                                   f"{target.kind.name}")
        return []

    def describe_device(self, dev: DeviceModel) -> str:
        return (f"device: {dev.name} ({dev.source}), {dev.num_units} units, "
                f"{dev.simd_bytes * 8}-bit SIMD, {dev.num_vector_registers} vector regs")

    def relax_stages(self) -> types.ModuleType:
        # (relax.pipeline.dataflow_lower_passes would dispatch, but in 0.27 it looks the
        # function up on the backend package, which does not export it)
        from tvm.relax.backend.cpu_generic import pipeline

        return pipeline
