"""Random valid rTiles from the space roller's policy searches (for the cost check's dataset).

Every axis is tiled reg | l1 | l2 | extent with exact divisors (the policy's ε = 0), the register
tile fits the vector register file and the L1 tile fits L1, like the policy's own candidates; the
sizes are otherwise uniform over the divisors, so the sample spans good and bad tiles.
"""
from __future__ import annotations

import random
from typing import List

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.traffic import accumulator_registers, input_bytes, output_bytes
from tvm_roller.backends.cpu.perf_model import predict_tiled
from tvm_roller.core.rtile import RTile, ceil_div
from tvm_roller.hardware import DeviceModel


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _multiples_dividing(base: int, extent: int) -> List[int]:
    return [m for m in range(base, extent + 1, base) if extent % m == 0]


def random_tiles(fa: FuncAnalysis, dev: DeviceModel, n: int, seed: int = 0,
                 max_tries: int = 200) -> List[RTile]:
    """Up to ``n`` distinct valid tiled rTiles (fewer when the space is small), each predicted."""
    if fa.kind != "tiled":
        return []
    rng = random.Random(seed)
    lanes = dev.simd_lanes(fa.dtype)
    v = fa.vector_axis
    l1_cap = dev.levels[0].capacity_bytes
    out: dict = {}
    for _ in range(n * max_tries):
        if len(out) >= n:
            break
        reg, l1, l2 = [], [], []
        for i, a in enumerate(fa.axes):
            if a.kind == "R":
                chunk = rng.choice(_divisors(a.extent))
                reg.append(1); l1.append(chunk); l2.append(chunk)
                continue
            if i == v and a.extent >= lanes:
                opts = [m for m in _multiples_dividing(lanes, a.extent) if m <= 4 * lanes]
                r = rng.choice(opts) if opts else a.extent
            else:
                r = rng.choice([d for d in _divisors(a.extent) if d <= 16] or [1])
            m1 = rng.choice(_multiples_dividing(r, a.extent))
            m2 = rng.choice(_multiples_dividing(m1, a.extent))
            reg.append(r); l1.append(m1); l2.append(m2)
        vec_loads = ceil_div(reg[v], lanes) if v is not None else 0
        if accumulator_registers(fa, reg, lanes) + vec_loads + 2 > dev.num_vector_registers:
            continue  # the policy's register-file constraint
        if input_bytes(fa, l1) + output_bytes(fa, l1) > l1_cap:
            continue
        t = RTile(kind="tiled", axes=[a.name for a in fa.axes],
                  extents=[a.extent for a in fa.axes], axis_kinds="".join(a.kind for a in fa.axes),
                  reg=reg, l1=l1, l2=l2, vector_axis=v, vector_lanes=lanes,
                  notes=["random sample (cost check)"])
        predict_tiled(fa, dev, t)
        out.setdefault(t.key(), t)
    return list(out.values())
