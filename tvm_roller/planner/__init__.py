"""The planner: the one front door every integration and tool goes through.

``Context.make`` normalises the target once and holds the device model, the backend, the
schedule cache and the caller's options; ``prepare`` analyses a function, ``plan_prepared`` constructs (or reads from the
cache) its rTiles, ``lower`` applies one, ``plan_dynamic`` / ``lower_dynamic`` do both per
bucket for symbolic extents, and ``schedule_function`` schedules one function with the one
decline / error / un-group / fallback path and its report entry. ``plan``, ``schedule``,
``build`` and ``explain`` are the public functions over them.
"""
from tvm_roller.planner.api import build, explain, plan, schedule
from tvm_roller.planner.buckets import DynamicPlan, lower_dynamic, plan_dynamic
from tvm_roller.planner.context import UNSET, CacheArg, Context, Measure, context_for, \
    schedule_cache
from tvm_roller.planner.lower import Lowered, PlannedSchedule, apply, lower, plan_and_lower
from tvm_roller.planner.plan import Plan, plan_prepared
from tvm_roller.planner.prepare import Prepared, prepare
from tvm_roller.planner.report import FuncReport, summarise
from tvm_roller.planner.scheduling import (Candidate, Candidates, ScheduleOptions, Scheduled,
                                         default_schedule, is_scheduled, schedule_candidates,
                                         schedule_function)

__all__ = ["Context", "Measure", "context_for", "schedule_cache", "CacheArg", "UNSET", "prepare", "Prepared", "plan_prepared", "Plan", "lower", "apply", "Lowered",
           "plan_and_lower", "PlannedSchedule", "plan_dynamic", "lower_dynamic", "DynamicPlan",
           "schedule_function", "Scheduled", "schedule_candidates", "Candidates",
           "Candidate", "ScheduleOptions", "FuncReport", "summarise",
           "default_schedule", "is_scheduled", "plan", "schedule", "build", "explain"]
