"""Relax integration: whole models through ``tvm.compile`` with roller scheduling every PrimFunc.

``get_pipeline`` is a ``relax_pipeline`` for ``tvm.compile``; ``compile`` adds a whole-module
cache; ``fusion_passes`` legalizes and fuses as the pipeline does (MetaSchedule's tasks);
``schedule_pass`` is roller's scheduling pass alone. The passes are in ``passes/``.
"""
from tvm_roller.integrations.relax.compile import compile  # noqa: A004
from tvm_roller.integrations.relax.passes.conv_layout import conv_layout_pass
from tvm_roller.integrations.relax.passes.group_chains import group_chains_pass
from tvm_roller.integrations.relax.passes.schedule import PROGRESS_MIN_FUNCS, schedule_pass
from tvm_roller.integrations.relax.passes.shape_bounds import module_bounds
from tvm_roller.integrations.relax.pipeline import fusion_passes, get_pipeline
from tvm_roller.planner import FuncReport, is_scheduled

__all__ = ["compile", "get_pipeline", "fusion_passes", "schedule_pass", "conv_layout_pass",
           "group_chains_pass", "module_bounds", "FuncReport", "is_scheduled",
           "PROGRESS_MIN_FUNCS"]
