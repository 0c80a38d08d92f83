"""PyTorch models into Relax: ``torch.export`` and TVM's importer, weights as constants."""
from __future__ import annotations


def import_torch(model, example, dynamic_shapes=None):
    """torch.export + Relax's importer; weights become constants (inference deployment), so
    transposes and folds of weights happen once, at compile time. ``dynamic_shapes``: what
    ``torch.export.export`` takes for the one input (e.g. ``{1: Dim("seq", min=1, max=512)}``):
    its bounds become the Relax function's shape-variable bounds."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        ep = torch.export.export(model.eval(), (example,), dynamic_shapes=None
                                 if dynamic_shapes is None else (dynamic_shapes,))
    return from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True)
