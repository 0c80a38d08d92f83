"""Persistent schedule cache: compiling the same function again skips roller's policy.

Layout: ``<cache_dir()>/schedules/<key[:2]>/<key>.json``, one file per key. ``key`` is the sha256 of
the *key material* (:mod:`tvm_roller.cache.keys`): the function, the normalised target, the
device constants, roller's version and code; for one bucket of a function with symbolic extents
also the bucket (which axes follow a shape variable and their smallest extents in the bucket:
the padding the tiles were weighed against).

Each file holds ``{"format", "key", "material", "topk", "tiles", "created", "checksum"}`` where
``checksum`` is the sha256 of the canonical JSON of everything else. A file that is empty,
truncated, not JSON, fails its checksum, belongs to another key or holds tiles that do not fit the
function is a miss: a :class:`CacheWarning` is issued and the file is removed, and the caller
re-plans (and rewrites it).

Concurrency: a writer writes a private temporary file in the entry's directory and renames it over
the entry (``os.replace`` is atomic on POSIX), so readers see either the old or the new complete
file, and two processes writing the same key leave one of their two complete files (both hold the
same plan). No lock is needed. Temporary files are removed on any error; one left by a killed
process is swept by a later ``put`` into the same directory once it is an hour old.

The cache is a source of tiles the planner consults (``planner.plan``), and knows nothing of
planning. A cached tile can never produce a wrong kernel: a tile only chooses loop splits and
annotations, and the ``s_tir`` schedule primitives preserve the function's semantics or raise.
The planner has the function's op rule validate each hit first (a tile whose splits make no
sense can crash TVM natively, so it must never reach a lowering), discards an entry whose tiles
do not fit or fail to apply, and re-plans. A function the planner rewrites into independent
parts has no entry of its own: each part is looked up and stored under its own key.
"""
from __future__ import annotations

import json
import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import tvm

from tvm_roller.cache.files import atomic_write, cache_dir
from tvm_roller.cache.keys import (JsonModel, canonical, context_material, func_fingerprint,
                                   material_digest, sha256)
from tvm_roller.core.errors import CacheWarning, InvalidTile
from tvm_roller.core.rtile import RTile

logger = logging.getLogger("tvm_roller")

_FORMAT = 1
_MAX_ENTRY_BYTES = 4 << 20  # an entry is a few KB; anything far bigger is not ours
_STALE_TMP_S = 3600.0  # a temporary file this old belongs to a writer that died
_TMP_SUFFIX = ".tmp"


class _BadEntry(InvalidTile):
    """An entry file that cannot be used (the message says why)."""


@dataclass(frozen=True)
class EntryKey:
    """One entry's name (``digest``) and what it was made of (``material``, JSON-native: as
    stored in, and compared with, the file)."""

    digest: str
    material: Dict[str, Any]


# -- the cache -------------------------------------------------------------------------------------
class ScheduleCache:
    """Per-key JSON files of planned rTiles under ``directory`` (default ``cache_dir()/schedules``).

    Keys take the normalised ``Target`` (``hardware.normalize_target``) and the device model the
    planner's context holds. ``get``/``lookup`` never crash on a bad file; ``put``/``store``
    raise OSError when the directory cannot be written (the planner turns that into a warning).
    ``stats()`` counts this instance's lookups: ``hits`` are entries that were used, ``misses``
    every lookup that ended in planning (including ``corrupt`` files and ``stale`` tiles). The
    files are safe to share between processes; an instance's counters are not meant to be
    shared between threads."""

    def __init__(self, directory: Optional[Path] = None):
        self.directory = Path(directory) if directory is not None else cache_dir() / "schedules"
        self._stats = {"hits": 0, "misses": 0, "corrupt": 0, "stale": 0, "writes": 0,
                       "write_errors": 0}

    # -- keys -----------------------------------------------------------------------------------
    def entry_key(self, func, target: tvm.target.Target, device: JsonModel,
                  bucket: Optional[Dict[str, Any]] = None) -> EntryKey:
        """The key of ``func``'s entry; ``bucket``: what a bucket of a function with symbolic
        extents was planned for (None: a static function)."""
        material = {"format": _FORMAT, "func": func_fingerprint(func),
                    **context_material(target, device)}
        if bucket is not None:
            material["bucket"] = bucket
        material = json.loads(canonical(material))  # exactly what a file round-trip gives back
        return EntryKey(material_digest(material), material)

    def key(self, func, target: tvm.target.Target, device: JsonModel) -> str:
        """The hex sha256 naming ``func``'s entry for this target and device."""
        return self.entry_key(func, target, device).digest

    def _path(self, digest: str) -> Path:
        return self.directory / digest[:2] / f"{digest}.json"

    def path(self, func, target: tvm.target.Target, device: JsonModel) -> Path:
        """Where ``func``'s entry lives (it may not exist)."""
        return self._path(self.key(func, target, device))

    # -- reading --------------------------------------------------------------------------------
    def get(self, func, target: tvm.target.Target, device: JsonModel,
            topk: int = 1) -> Optional[List[RTile]]:
        """The cached top-``topk`` tiles, or None (a miss; a bad file also warns and is removed).
        An entry planned with a smaller topk than asked for is a miss too."""
        return self.lookup(self.entry_key(func, target, device), topk)

    def lookup(self, k: EntryKey, topk: int = 1) -> Optional[List[RTile]]:
        """:meth:`get` by key."""
        path = self._path(k.digest)
        try:
            with open(path, "rb") as fh:
                seen = os.fstat(fh.fileno())
                raw = fh.read(_MAX_ENTRY_BYTES + 1)
        except (FileNotFoundError, NotADirectoryError):  # no entry (or no cache directory)
            self._stats["misses"] += 1
            return None
        except OSError as err:  # a directory in its place, no permission, an I/O error
            self._discard(path, f"{type(err).__name__}: {err}", "corrupt")
            return None
        try:
            tiles, stored_topk = _parse_entry(raw, k)
        except (_BadEntry, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
            # json.JSONDecodeError is a ValueError; a foreign tile dict gives TypeError in RTile()
            self._discard(path, f"{type(err).__name__}: {err}", "corrupt", seen)
            return None
        if stored_topk < topk:
            self._stats["misses"] += 1  # planned for fewer candidates than asked for: re-plan
            return None
        self._stats["hits"] += 1
        return tiles[:topk]

    def discard(self, k: EntryKey, why: str) -> None:
        """Drop an entry a lookup served that turned out unusable (its tiles do not fit the
        function or fail to apply): warned, counted as stale, removed."""
        self._discard(self._path(k.digest), why, "stale")

    def _discard(self, path: Path, why: str, counter: str,
                 seen: Optional[os.stat_result] = None) -> None:
        """Warn about an unusable entry and remove it. With ``seen`` (the stat of the file that
        was read) only while it is still that file: a writer may have replaced it meanwhile."""
        self._stats[counter] += 1
        if counter == "stale":  # it was counted as a hit when it was looked up
            self._stats["hits"] -= 1
        self._stats["misses"] += 1
        warnings.warn(f"ignoring schedule cache entry {path} ({why}); re-planning",
                      CacheWarning, stacklevel=3)
        try:
            now = os.stat(path)
            if seen is None or (now.st_ino, now.st_dev) == (seen.st_ino, seen.st_dev):
                os.unlink(path)
        except FileNotFoundError:
            pass  # already gone
        except OSError as err:  # e.g. a read-only cache: the entry keeps being ignored
            logger.debug("cannot remove %s: %s", path, err)

    def invalidate(self, func, target: tvm.target.Target, device: JsonModel) -> bool:
        """Remove ``func``'s entry; True if there was one."""
        try:
            os.unlink(self.path(func, target, device))
            return True
        except FileNotFoundError:
            return False

    # -- writing --------------------------------------------------------------------------------
    def put(self, func, target: tvm.target.Target, device: JsonModel, tiles: List[RTile],
            topk: Optional[int] = None) -> None:
        """Store ``tiles`` (best first) for ``func``; ``topk``: how many were asked for (default
        ``len(tiles)``; the policy may return fewer). Atomic; raises OSError if not writable."""
        self.store(self.entry_key(func, target, device), tiles, topk)

    def store(self, k: EntryKey, tiles: List[RTile], topk: Optional[int] = None) -> None:
        """:meth:`put` by key."""
        if not tiles:
            raise ValueError("no tiles to cache")
        entry = {
            "format": _FORMAT,
            "key": k.digest,
            "material": k.material,
            "topk": int(topk if topk is not None else len(tiles)),
            "tiles": [json.loads(t.to_json()) for t in tiles],
            "created": time.time(),
        }
        entry["checksum"] = sha256(canonical(entry))
        path = self._path(k.digest)
        try:
            # no fsync: after a power cut an entry may be empty or truncated, which the
            # checksum turns into a miss, and a compile writing hundreds of entries should not
            # wait for the disk
            atomic_write(path, json.dumps(entry, sort_keys=True, indent=1).encode("utf-8"),
                         suffix=_TMP_SUFFIX)
        except OSError:
            self._stats["write_errors"] += 1
            raise
        self._stats["writes"] += 1
        _sweep_stale_tmp(path.parent)

    def stats(self) -> dict:
        """Counts of this instance: hits, misses (incl. corrupt), corrupt, stale, writes,
        write_errors."""
        return dict(self._stats)


def _parse_entry(raw: bytes, k: EntryKey) -> Tuple[List[RTile], int]:
    """(tiles, topk) of an entry file's bytes; raises _BadEntry/ValueError/KeyError/TypeError."""
    if len(raw) > _MAX_ENTRY_BYTES:
        raise _BadEntry("file too large")
    if not raw:
        raise _BadEntry("empty file")
    entry = json.loads(raw.decode("utf-8"))
    if not isinstance(entry, dict):
        raise _BadEntry("not a JSON object")
    if entry.get("format") != _FORMAT:
        raise _BadEntry(f"format {entry.get('format')!r}, expected {_FORMAT}")
    checksum = entry.pop("checksum", None)
    if checksum != sha256(canonical(entry)):
        raise _BadEntry("checksum mismatch")
    if entry["key"] != k.digest or entry["material"] != k.material:
        raise _BadEntry("entry belongs to another key")
    topk, raw_tiles = entry["topk"], entry["tiles"]
    if not (isinstance(topk, int) and not isinstance(topk, bool) and topk >= 1
            and isinstance(raw_tiles, list) and raw_tiles
            and all(isinstance(d, dict) for d in raw_tiles)):
        raise _BadEntry("no tiles")
    tiles = [RTile.from_json(json.dumps(d)) for d in raw_tiles]
    for t in tiles:
        t.check_shape()
    return tiles, topk


def _sweep_stale_tmp(directory: Path) -> None:
    """Remove temporary files of writers that died mid-write (old enough not to be in flight)."""
    cutoff = time.time() - _STALE_TMP_S
    try:
        names = [n for n in os.listdir(directory) if n.startswith(".") and n.endswith(_TMP_SUFFIX)]
    except OSError:
        return
    for name in names:
        p = directory / name
        try:
            if p.stat().st_mtime < cutoff:
                p.unlink()
        except FileNotFoundError:
            pass  # its writer finished (renamed it) or another sweeper got it
        except OSError as err:
            logger.debug("cannot sweep %s: %s", p, err)
