"""PyTorch models into Relax: ``torch.export`` and TVM's importer, weights as constants.

TVM 0.27's importer is extended by ``convert_map()``: matmuls and convolutions that keep bf16 /
fp16 (``low_precision``), PyTorch's advanced indexing with index tensors of any ranks
(``indexing``), a division by a number in the tensor's dtype (``arith``), and the ops a
mixture-of-experts layer exports to (``moe_ops``: ``histc``, ``grouped_mm``, ``index_add``,
``scatter_add``).
"""
from __future__ import annotations

from typing import Callable, Dict


def convert_map() -> Dict[str, Callable]:
    """Every converter this package adds to ``from_exported_program``'s ``custom_convert_map``."""
    from tvm_roller.integrations.pytorch.arith import CONVERTERS as ARITH
    from tvm_roller.integrations.pytorch.indexing import CONVERTERS as INDEXING
    from tvm_roller.integrations.pytorch.low_precision import MATMULS
    from tvm_roller.integrations.pytorch.moe_ops import CONVERTERS as MOE

    return {**MATMULS, **ARITH, **INDEXING, **MOE}


def import_torch(model, example, dynamic_shapes=None):
    """torch.export + Relax's importer; weights become constants (inference deployment), so
    transposes and folds of weights happen once, at compile time. ``dynamic_shapes``: what
    ``torch.export.export`` takes for the one input (e.g. ``{1: Dim("seq", min=1, max=512)}``):
    its bounds become the Relax function's shape-variable bounds. Matmuls of bf16 / fp16
    operands (and convolutions) give a result of that dtype, as in PyTorch."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        ep = torch.export.export(model.eval(), (example,), dynamic_shapes=None
                                 if dynamic_shapes is None else (dynamic_shapes,))
    return from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True,
                                 custom_convert_map=convert_map())
