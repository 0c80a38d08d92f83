"""Device models: presets, models derived from TVM targets, and on-machine calibration."""
from .cache import cache_dir
from .calibrate import calibrate
from .cpu import from_target, normalize_target, target_completion_notes
from .model import DeviceModel, MemoryLevel
from .presets import list_presets, preset

__all__ = [
    "MemoryLevel", "DeviceModel", "preset", "list_presets", "from_target", "normalize_target",
    "target_completion_notes", "calibrate", "cache_dir",
]
