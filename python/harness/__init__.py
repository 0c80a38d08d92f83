"""The development harness, beside the scripts in ``python/`` that use it (not shipped in the
wheel; ``python python/<script>.py`` puts this folder on the path, pytest's ``pythonpath``
the tests'): ``random_cases`` (random operators checked in isolated workers), ``cuda_check``
(generated CUDA checked without a GPU, and the bundles a GPU machine runs), ``bench`` (timing
roller against its peers, the benchmark chains) and ``examples`` (example PyTorch and
HuggingFace models). It imports ``tvm_roller``; ``tvm_roller`` never imports it."""
