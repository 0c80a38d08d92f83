"""The micro-kernel family: every route, and the candidates a device has for a product, each
with its rate — measured on this machine (``CpuTraits.route_gops``, by ``calibrate``) or the
route's preset, labelled as such."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from tvm_roller.backends.cpu.microkernel.arm_dot import SDOT, UDOT, USDOT
from tvm_roller.backends.cpu.microkernel.route import Operands, Route, Shape
from tvm_roller.backends.cpu.microkernel.widen import (INT8_MADD_256, INT8_MADD_512,
                                                       INT8_WIDEN, Bf16Widen, Fp32Fma)
from tvm_roller.backends.cpu.microkernel.x86_amx import AMX_BF16, AMX_INT8
from tvm_roller.backends.cpu.microkernel.x86_dot import AvxVnni256, Bf16Dot512, Vnni512
from tvm_roller.hardware.model import DeviceModel

ROUTES: Tuple[Route, ...] = (
    AMX_BF16, AMX_INT8, Bf16Dot512(), Vnni512(), AvxVnni256(), INT8_MADD_512, INT8_MADD_256,
    SDOT, UDOT, USDOT, Bf16Widen(), INT8_WIDEN, Fp32Fma(),
)


@dataclass(frozen=True)
class Candidate:
    """One route and register block for a product on a device, with one core's rate."""

    route: Route
    ops: Operands
    shape: Shape
    gops: float
    measured: bool  # the rate was measured on this machine (else the route's preset)

    @property
    def key(self) -> str:
        return self.route.key(self.shape)

    def describe(self) -> str:
        source = "measured" if self.measured else "preset"
        return (f"{self.route.instruction} ({self.route.name}), block {self.shape.label}, "
                f"{self.gops:.0f} GOP/s per core ({source})")


def candidates(dev: DeviceModel, ops: Operands) -> List[Candidate]:
    """Every (route, block) ``dev`` has for ``ops``, fastest first."""
    measured = (dev.cpu.route_gops if dev.cpu else None) or {}
    out = []
    for route in ROUTES:
        if not route.usable(dev, ops):
            continue
        for shape in route.shapes(dev, ops):
            key = route.key(shape)
            rate = measured.get(key)
            out.append(Candidate(route, ops, shape,
                                 rate if rate else route.preset_gops(dev, ops, shape), bool(rate)))
    return sorted(out, key=lambda c: -c.gops)


def route_named(name: str) -> Route:
    return next(r for r in ROUTES if r.name == name)
