"""Persistent caches: keys, the schedule cache (tiles the planner consults), the compiled-module
cache, the cache directory and the atomic writes every cache file goes through.

A layer low in the house: it knows nothing of planning, targets or device models beyond the
``Target`` and the JSON of a device model its keys are made of (the calibration store in
``hardware`` uses its files too).
"""
from tvm_roller.cache.files import cache_dir
from tvm_roller.cache.modules import ModuleCache
from tvm_roller.cache.schedules import EntryKey, ScheduleCache
from tvm_roller.core.errors import CacheWarning

__all__ = ["ScheduleCache", "ModuleCache", "EntryKey", "CacheWarning", "cache_dir"]
