"""One expression mutator over every Relax function of a module (the passes' common loop)."""
from __future__ import annotations

import tvm
from tvm import relax


def mutate_functions(mod: tvm.IRModule, mutator) -> tvm.IRModule:
    """A copy of ``mod`` with ``mutator.visit_expr`` applied to each Relax function, normalized
    (the caller's module is left as it was: assigning a function changes a module in place)."""
    mod = mod.clone()
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = mutator.visit_expr(func)
    return relax.transform.Normalize()(mod)


def mutate_with_new_functions(mod: tvm.IRModule, mutator_class) -> tvm.IRModule:
    """``mutator_class(mod)`` applied to each Relax function of ``mod``, for a mutator whose
    rewrites add PrimFuncs through its builder (``self.builder_.call_te``): the builder's
    module, with them, normalized."""
    mutator = mutator_class(mod)
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return relax.transform.Normalize()(mutator.builder_.get())
