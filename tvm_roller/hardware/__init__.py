"""Device models: presets, models derived from TVM targets, and on-machine calibration."""
from typing import Optional

from . import gpu
from .cache import cache_dir
from .calibrate import calibrate
from .cpu import TargetLike, normalize_target, target_completion_notes
from .cpu import from_target as cpu_from_target
from .model import DeviceModel, MemoryLevel
from .presets import list_presets, preset


def from_target(target: TargetLike, use_cache: bool = True, *,
                host_caches: Optional[bool] = None) -> DeviceModel:
    """DeviceModel of a TVM target: ``cpu.from_target`` for llvm, ``gpu.from_target`` for cuda
    (a preset chosen by tag or compute capability; never a live device)."""
    tgt = normalize_target(target)
    if tgt.kind.name == "cuda":
        return gpu.from_target(tgt)
    return cpu_from_target(tgt, use_cache, host_caches=host_caches)


__all__ = [
    "MemoryLevel", "DeviceModel", "preset", "list_presets", "from_target", "normalize_target",
    "target_completion_notes", "calibrate", "cache_dir", "gpu",
]
