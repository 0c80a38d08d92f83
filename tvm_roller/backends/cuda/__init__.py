"""The CUDA backend: rules in ``rules/``, policy, micro-model, lowering, tensor cores, chains."""
from tvm_roller.backends.cuda.backend import CudaBackend

__all__ = ["CudaBackend"]
