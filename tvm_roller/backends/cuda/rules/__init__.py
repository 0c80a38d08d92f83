"""The CUDA backend's op rules, one op class per file, and their registry: ``RULES``, tried in
order (the first whose ``matches`` takes a function schedules it). Adding an op class: a rule
file here and one line below."""
from tvm_roller.backends.cuda.rules.streaming import StreamingRule
from tvm_roller.backends.cuda.rules.tiled import TiledRule

RULES = (
    TiledRule,      # reuse-heavy functions: SIMT block tiles, tensor cores for fp16 matmuls
    StreamingRule,  # memory-bound reductions and elementwise functions
)
