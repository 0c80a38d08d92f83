"""The import of ``cache_ops``' two torch ops into Relax: an in-place write
(``R.call_tir_inplace``: the cache parameter itself is updated, only the new positions move)
and the attention over the cache, each a roller CPU kernel (``backends.cpu.kv_cache``).

The kernels' static dimensions come from the cache's layout, their tiles from the device
model (``backends.cpu.attention_plan``); each generated kernel is recorded as a report entry with its
tiles and its roofline bound at a sequence's full length (the planner leaves pre-scheduled
functions alone)."""
from __future__ import annotations

from typing import Callable, Dict, Tuple

from tvm import relax, tirx

from tvm_roller.backends.cpu.kv_cache import CacheLayout, attention_kernel, write_kernel
from tvm_roller.backends.cpu.attention_plan import AttentionTiles, plan_tiles
from tvm_roller.backends.cpu.kv_prompt_attention import prompt_attention_kernel
from tvm_roller.backends.cpu.attention_work import attention_work, write_work
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware.model import DeviceModel
from tvm_roller.planner import FuncReport
from tvm_roller.planner.roofline import counted_bound


def _tiles(layout: CacheLayout, dev: DeviceModel) -> AttentionTiles:
    tiles = plan_tiles(dev, layout.head_dim, layout.length, layout.group)
    if tiles.block != layout.block:
        raise UnsupportedError(f"the cache is in blocks of {layout.block} positions; the "
                               f"kernels are planned for {tiles.block} on {dev.name}")
    return tiles


def converters(report: list, prefix: str, dev: DeviceModel,
               layout: CacheLayout) -> Dict[str, Callable]:
    """``from_exported_program``'s ``custom_convert_map`` for the two ops over a cache of
    ``layout`` (its ``heads`` the attention's), their kernels planned for ``dev``; the kernels
    they add are named ``<prefix>_kv_...`` and ``report`` gets one entry for each (bounds at a
    sequence's full length)."""
    tiles = _tiles(layout, dev)

    def add(importer, func, name: str, kind: str, work: Tuple[float, int], context: str,
            rtile: dict):
        name = f"{prefix}_{name}"
        b = counted_bound(*work, dev)
        report.append(FuncReport(name, "roller", kind=kind, rtile=rtile, bound_s=b.seconds,
                                 bound_by=f"{b.by} ({context})").to_dict())
        return importer.block_builder.add_func(func, name)

    def write(node, importer):
        cache, new, tables, lengths = (importer.env[a] for a in node.args[:4])
        layer, keys = int(node.args[4]), bool(node.args[5])
        m = new.ty.shape[2]
        # a prompt's positions: bounded at the whole sequence
        m = int(m) if isinstance(m, tirx.IntImm) else layout.length
        func = write_kernel(layout, layer, keys)
        gv = add(importer, func, f"kv_write_{'keys' if keys else 'values'}_{layer}", "kv-write",
                 write_work(layout.kv_heads, layout.head_dim, m), f"{m} positions",
                 {"block": layout.block})
        return importer.block_builder.emit(relax.call_tir_inplace(
            gv, [cache, new, tables, lengths], [0], cache.ty))

    def attend(node, importer):
        q, keys, values, tables, lengths = (importer.env[a] for a in node.args[:5])
        layer, scale = int(node.args[5]), float(node.args[6])
        batch, heads, m, head_dim = q.ty.shape
        if int(heads) != layout.heads:
            raise UnsupportedError(f"{int(heads)} query heads, the config says {layout.heads}")
        # one query a sequence (a decode step): split along the context; a prompt's: tiles
        # of queries
        one = isinstance(m, tirx.IntImm) and int(m) == 1
        if not one and not (isinstance(batch, tirx.IntImm) and int(batch) == 1):
            raise UnsupportedError("a prompt's attention takes one sequence at a time")
        func = attention_kernel(layout, layer, scale, tiles) if one \
            else prompt_attention_kernel(layout, layer, scale, tiles)
        queries = 1 if one else layout.length
        gv = add(importer, func, f"kv_attention_{layer}", "kv-attention",
                 attention_work(layout.heads, layout.kv_heads, layout.head_dim, queries,
                                layout.length, causal=True),
                 f"{queries} queries over {layout.length} positions", tiles.to_dict())
        out = relax.TensorType((batch, m, heads, head_dim), q.ty.dtype)
        return importer.block_builder.emit(relax.call_tir(
            gv, [q, keys, values, tables, lengths], out))

    return {"kv_write.default": write, "kv_attention.default": attend}
