"""The CPU backend (TVM's LLVM target): rules in ``rules/``, policy, micro-model and lowering."""
from tvm_roller.backends.cpu.backend import CpuBackend

__all__ = ["CpuBackend"]
