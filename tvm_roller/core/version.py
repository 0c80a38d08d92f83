"""The package version (read by the caches' keys; re-exported as ``tvm_roller.__version__``)."""
__version__ = "0.1.1"
