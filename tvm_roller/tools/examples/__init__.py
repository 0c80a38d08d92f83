"""Example PyTorch models for ``tvm-roller compile-model`` (see :mod:`tvm_roller.tools.examples.models`)."""
