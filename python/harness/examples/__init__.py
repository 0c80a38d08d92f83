"""Example PyTorch models (``models``: an MLP, a BERT layer, a CNN; ``MODULE:FACTORY`` for
``tvm-roller compile-model``, e.g. ``harness.examples.models:bert_layer`` with ``python/`` on
``PYTHONPATH``), HuggingFace architectures at test and real sizes (``hf_models``) and Relax
functions with fused epilogues (``fused_funcs``), for the tests, tutorials and benchmarks. The
models the command line builds by name are in :mod:`tvm_roller.tools.models`."""
