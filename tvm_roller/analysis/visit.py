"""A post-order walk over TIR nodes (TVM 0.27 exposes no TIR visitor to Python).

Walks the FFI-reflected fields of each node, so it follows every statement and expression kind
without a list of node types; spans and buffer declarations are not entered.
"""
from __future__ import annotations

from typing import Callable, Iterator

import tvm_ffi
from tvm import tirx

_SKIP_FIELDS = {"span", "buffer_map", "alloc_buffers", "match_buffers", "annotations"}


def _fields(cls) -> list:
    names = []
    info = getattr(cls, "__tvm_ffi_type_info__", None)
    while info is not None:
        names.extend(f.name for f in info.fields)
        info = info.parent_type_info
    return [n for n in names if n not in _SKIP_FIELDS]


_FIELD_CACHE: dict = {}


def child_nodes(node) -> Iterator:
    """The reflected fields of a node that hold other nodes (or lists of them), in order."""
    cls = type(node)
    names = _FIELD_CACHE.get(cls)
    if names is None:
        names = _FIELD_CACHE[cls] = _fields(cls)
    for name in names:
        child = getattr(node, name, None)
        if child is not None:
            yield child


def post_order_visit(node, fvisit: Callable) -> None:
    """Call ``fvisit`` on every node under ``node`` (children first)."""
    if isinstance(node, (list, tuple, tvm_ffi.Array)):
        for x in node:
            post_order_visit(x, fvisit)
        return
    if not isinstance(node, tvm_ffi.core.Object) or isinstance(node, (tirx.Buffer, str)):
        return
    for child in child_nodes(node):
        post_order_visit(child, fvisit)
    fvisit(node)
