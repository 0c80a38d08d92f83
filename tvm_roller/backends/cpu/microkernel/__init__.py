"""The micro-kernel layer under the rTile's register level: one interface (``route``), one
member per instruction route (x86 AMX, AVX512-BF16, AVX512-VNNI / AVX-VNNI, ``vpmaddwd``; AArch64
``sdot`` / ``udot`` / ``usdot``; bf16 → fp32 FMA and int8 widening on any SIMD), each declaring
its own lanes, groups and instructions; ``family.candidates`` lists what a device has, with
rates measured on the machine or preset."""
from tvm_roller.backends.cpu.microkernel.family import ROUTES, Candidate, candidates, route_named
from tvm_roller.backends.cpu.microkernel.route import OPERAND_DTYPES, Operands, Route, Shape

__all__ = ["ROUTES", "Candidate", "candidates", "route_named", "OPERAND_DTYPES", "Operands",
           "Route", "Shape"]
