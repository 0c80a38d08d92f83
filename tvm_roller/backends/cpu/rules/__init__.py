"""The CPU backend's op rules, one op class per file, and their registry: ``RULES``, tried in
order (the first whose ``matches`` takes a function schedules it; a more specific class comes
before the general one it refines). Adding an op class: a rule file here and one line below."""
from tvm_roller.backends.cpu.rules.conv import ConvRule
from tvm_roller.backends.cpu.rules.microkernel import MicroKernelRule
from tvm_roller.backends.cpu.rules.streaming import StreamingRule
from tvm_roller.backends.cpu.rules.tiled import TiledRule

RULES = (
    MicroKernelRule,  # bf16 / int8 operands: the micro-kernel route the device model picks
    ConvRule,       # convolutions are tiled too: their own rule comes first
    TiledRule,      # reuse-heavy functions: GEMM-like and the rest of the reductions with reuse
    StreamingRule,  # memory-bound reductions, elementwise functions and gathers
)
