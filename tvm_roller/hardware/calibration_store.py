"""On-disk store of calibrated device models.

Layout: ``<cache_dir()>/calibration/<key>.json`` holding ``{"format": 1, "key": ..., "model": {...}}``.
The directory is ``cache.files.cache_dir()``. Files are written atomically
(``cache.files.atomic_write``) so a reader never sees half a file from a
concurrent writer; a file that is nevertheless unreadable (truncated, hand-edited, older format)
is ignored with a warning so the caller falls back to estimated numbers. Files written before
``DeviceModel`` had typed traits (a flat ``"extra"`` dict in the model) still load: ``from_json``
maps that dict onto ``DeviceModel.cpu``.
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Optional, Sequence

from tvm_roller.cache.files import atomic_write, cache_dir
from tvm_roller.hardware.model import DeviceModel

_FORMAT = 1


def calibration_key(host_cpu: str, mcpu: str, num_cores: int, mattr: Sequence[str] = ()) -> str:
    """Key of one calibration: the host CPU it ran on, the target mcpu (+ mattr), the core count."""
    raw = f"{host_cpu}__{mcpu}__{int(num_cores)}c"
    if mattr:  # "-avx512f" changes the code, hence the numbers
        raw += "__" + ",".join(sorted(mattr))
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)  # keys become file names


def calibration_path(key: str) -> Path:
    return cache_dir() / "calibration" / f"{key}.json"


def _check(model: DeviceModel) -> None:
    # A syntactically valid file can still be useless (zeros from an aborted run, hand edits).
    if not model.levels:
        raise ValueError("no memory levels")
    if not model.peak_gflops.get("float32", 0.0) > 0.0:
        raise ValueError("float32 peak is not positive")
    for lvl in model.levels:
        if not (lvl.bandwidth_gbs > 0.0 and lvl.capacity_bytes > 0):
            raise ValueError(f"level {lvl.name} has a non-positive bandwidth or capacity")


def load_calibration(key: str) -> Optional[DeviceModel]:
    """The cached model for ``key``, or None when there is none or it cannot be read (warns)."""
    path = calibration_path(key)
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise ValueError(f"not a format-{_FORMAT} calibration record")
        model = DeviceModel.from_json(json.dumps(payload["model"]))
        _check(model)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        # json.JSONDecodeError is a ValueError; bad fields give TypeError/KeyError in from_json.
        warnings.warn(
            f"ignoring unreadable calibration cache file {path} ({type(err).__name__}: {err}); "
            "estimated numbers are used instead. Re-run tvm_roller.hardware.calibrate() to rebuild it.",
            stacklevel=2,
        )
        return None
    model.source = f"calibrated:{path}"
    return model


def save_calibration(key: str, model: DeviceModel) -> Path:
    """Write ``model`` under ``key`` atomically; returns the file path."""
    path = calibration_path(key)
    payload = {"format": _FORMAT, "key": key, "model": json.loads(model.to_json())}
    atomic_write(path, json.dumps(payload, indent=1, sort_keys=True).encode("utf-8"), fsync=True)
    return path
