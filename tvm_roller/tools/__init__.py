"""Tools over the library (the top floor: nothing below imports them): the ``tvm-roller``
command line, compile-model, the single-op suite, the cost check, the CUDA checks, the random
cases, example models and the benchmark plumbing (``bench``)."""
