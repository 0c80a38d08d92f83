"""Relax integration: a ``relax_pipeline`` for ``tvm.compile`` that lets roller schedule every PrimFunc."""
from __future__ import annotations

import tvm
from tvm import relax


def fusion_passes() -> tvm.transform.Pass:
    """Legalize and fuse the way roller's pipeline does (elementwise epilogues join their producer).

    MetaSchedule tasks extracted from ``fusion_passes()(mod)`` are exactly the PrimFuncs the roller
    pipeline schedules, so records written for them apply to what the pipeline builds."""
    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ], name="RollerFusion")
