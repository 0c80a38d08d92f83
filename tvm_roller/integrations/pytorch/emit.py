"""The kernels the converters add, named apart per importing caller.

Two functions imported separately and merged into one module (``tvm_roller.llm``'s prefill and
decode) would otherwise both hold a PrimFunc named ``routed_matmul``; a caller sets
``importer.kernel_prefix`` (``with_prefix``) and every kernel is named after it."""
from __future__ import annotations

from typing import Callable, Dict, Optional


def emit_kernel(importer, func, *args, attrs: Optional[dict] = None):
    """``importer.block_builder.emit_te(func, *args)``, the PrimFunc named ``<prefix><func>``
    (with ``attrs``, if any)."""
    prefix = getattr(importer, "kernel_prefix", "")
    extra = {"primfunc_attrs": attrs} if attrs else {}
    return importer.block_builder.emit_te(func, *args,
                                          primfunc_name_hint=f"{prefix}{func.__name__}", **extra)


def with_prefix(converters: Dict[str, Callable], prefix: str) -> Dict[str, Callable]:
    """``converters`` whose kernels are named ``<prefix>...``."""

    def named(convert):
        def run(node, importer):
            importer.kernel_prefix = prefix
            return convert(node, importer)
        return run

    return {op: named(convert) for op, convert in converters.items()}
