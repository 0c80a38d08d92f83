"""``import tvm.s_tir.tensor_intrin`` in seconds instead of a minute.

MetaSchedule's ``TuneContext`` imports ``tvm.s_tir.tensor_intrin`` (every tensor intrinsic, ~1,500
TVMScript functions). Each ``@T.prim_func`` calls ``inspect.stack()``, and ``inspect.getmodule``
scans all of ``sys.modules`` for every frame whose file is a pseudo-file (``<frozen
importlib._bootstrap>``, ``<string>``, ``<ast>``): ~30,000 scans, 60-70 s on this machine.

For a ``<...>`` name the scan never finds a module, and the answer does not matter: ``linecache``
refuses to load source for such names, so the frame gets no source line either way. Telling
``inspect`` up front which module those names belong to skips the scans and changes nothing else.
"""
from __future__ import annotations

import inspect
import sys

# the pseudo-files the import's frames come from (measured: 20,000 of the 30,500 lookups)
PSEUDO_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>",
                "<string>", "<ast>")


def import_tensor_intrin() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` once per process, skipping ``inspect``'s scans."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    added = [name for name in PSEUDO_FILES if name not in inspect.modulesbyfile]
    for name in added:
        inspect.modulesbyfile[name] = "importlib._bootstrap"
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics)
    finally:
        for name in added:
            inspect.modulesbyfile.pop(name, None)
