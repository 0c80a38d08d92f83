"""The import of ``cache_ops``' two torch ops into Relax: an in-place write
(``R.call_tir_inplace``: the cache parameter itself is updated, only the new positions move)
and the attention over the cache, each a roller CPU kernel (``backends.cpu.kv_cache``).

The kernels' static dimensions come from the operands' shapes; each generated kernel is
recorded as a report entry (the planner leaves pre-scheduled functions alone)."""
from __future__ import annotations

from typing import Callable, Dict, List

from tvm import relax, tirx

from tvm_roller.backends.cpu.kv_cache import CacheLayout, attention_kernel, write_kernel
from tvm_roller.backends.cpu.kv_prompt_attention import prompt_attention_kernel
from tvm_roller.planner import FuncReport


def _dims(expr) -> List[int]:
    return [int(d) for d in expr.ty.shape]


def _layout(keys, heads: int) -> CacheLayout:
    layers, kv_heads, blocks, head_dim, block = _dims(keys)
    return CacheLayout(layers, kv_heads, head_dim, blocks * block, heads)


def converters(report: list, prefix: str) -> Dict[str, Callable]:
    """``from_exported_program``'s ``custom_convert_map`` for the two ops; the kernels they add
    are named ``<prefix>_kv_...`` and ``report`` gets one entry for each."""

    def add(importer, func, name: str, kind: str):
        name = f"{prefix}_{name}"
        report.append(FuncReport(name, "roller", kind=kind).to_dict())
        return importer.block_builder.add_func(func, name)

    def write(node, importer):
        cache, new, marker = (importer.env[a] for a in node.args[:3])
        layer, keys = int(node.args[3]), bool(node.args[4])
        layout = _layout(cache, 0) if keys else _value_layout(cache)
        func = write_kernel(layout, layer, keys)
        gv = add(importer, func, f"kv_write_{'keys' if keys else 'values'}_{layer}", "kv-write")
        return importer.block_builder.emit(relax.call_tir_inplace(
            gv, [cache, new, marker], [0], cache.ty))

    def attend(node, importer):
        q, keys, values, marker = (importer.env[a] for a in node.args[:4])
        layer, scale = int(node.args[4]), float(node.args[5])
        _, heads, m, head_dim = q.ty.shape
        layout = _layout(keys, int(heads))
        # one query (a decode step): split along the context; a prompt's: tiles of queries
        one = isinstance(m, tirx.IntImm) and int(m) == 1
        func = attention_kernel(layout, layer, scale) if one \
            else prompt_attention_kernel(layout, layer, scale)
        gv = add(importer, func, f"kv_attention_{layer}", "kv-attention")
        out = relax.TensorType((1, m, heads, head_dim), q.ty.dtype)
        return importer.block_builder.emit(relax.call_tir(gv, [q, keys, values, marker], out))

    return {"kv_write.default": write, "kv_attention.default": attend}


def _value_layout(values) -> CacheLayout:
    layers, kv_heads, length, head_dim = _dims(values)
    return CacheLayout(layers, kv_heads, head_dim, length, 0)
