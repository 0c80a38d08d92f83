"""Models the command line builds by name, with random weights (nothing downloaded): the
HuggingFace architectures of ``hf:NAME`` (``hf_archs``) for ``compile-model`` and
``profile-model``, the causal LMs of ``generate`` (``llm_configs``)."""
