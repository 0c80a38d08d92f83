"""Device models: presets, models derived from TVM targets, and on-machine calibration."""
from tvm_roller.hardware import gpu
from tvm_roller.cache.files import cache_dir
from tvm_roller.hardware.calibrate import calibrate
from tvm_roller.hardware.target import (HOST_TARGET, complete_target, host_target,
                                        normalize_target, target_completion_notes)
from tvm_roller.hardware.model import CpuTraits, DeviceModel, GpuTraits, MemoryLevel
from tvm_roller.hardware.presets import list_presets, preset


__all__ = [
    "MemoryLevel", "DeviceModel", "CpuTraits", "GpuTraits", "preset", "list_presets",
    "normalize_target", "complete_target", "host_target", "HOST_TARGET",
    "target_completion_notes", "calibrate", "cache_dir", "gpu",
]
