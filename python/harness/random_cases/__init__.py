"""Random-case reliability harness (development harness, not imported by the library).

Seeded random cases of every op family roller schedules (``families``; and HF's eager attention
as a Relax model compiled whole, CPU only: ``attention``) are built, run and compared with a
float64 reference on the CPU (``check_cpu``), or lowered, verified and nvcc-compiled for CUDA
with their CPU replica compared (``check_cuda``). CPU cases can be built
for any llvm target (``targets``: ``--llvm-target``); where this host cannot run its code they
are compiled to an object file and counted as *not_run* ("built, not run"). Each case runs in an
isolated worker process (``worker``, driven by ``runner``) so that a crash or a hang is a
classified result, not the end of the run; ``report`` sums the results up.
``python/random_cases.py`` is the command line.
"""
