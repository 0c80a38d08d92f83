"""Where roller's caches live, and the one way their files are written.

The directory is ``$TVM_ROLLER_CACHE`` or ``~/.cache/tvm-roller``; each cache has a folder of
its own under it (``calibration/``, ``schedules/``, ``modules/``). Every file is written through
:func:`atomic_write`, so a reader sees the old or the new complete file, never half of one.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_ENV = "TVM_ROLLER_CACHE"


def cache_dir() -> Path:
    """``$TVM_ROLLER_CACHE`` if set, else ``~/.cache/tvm-roller`` (not created by this call)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tvm-roller"


def atomic_write(path: Path, data: bytes, fsync: bool = False, suffix: str = ".tmp") -> None:
    """Write ``data`` to ``path`` via a private temporary file in the same directory and
    ``os.replace``: readers see the old or the new complete file, never half of one, and
    concurrent writers cannot interleave. ``fsync`` makes it survive a power cut too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        # never leave temporary files behind; the error itself propagates
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def remove_quietly(path: Path) -> bool:
    """Remove ``path``; False when it was already gone (another process got there first)."""
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
