"""Persistent schedule cache: compiling the same function again skips roller's policy.

Layout: ``<cache_dir()>/schedules/<key[:2]>/<key>.json``, one file per key. ``key`` is the sha256 of
the *key material*:

* ``func``: ``tvm_ffi.structural_hash`` of the PrimFunc with its ``global_symbol`` attribute
  removed, plus the parameters' dtypes and shapes. The name is dropped on purpose: Relax's FuseTIR
  names identical layers ``fused_matmul_add``, ``fused_matmul_add1``, ... and they should share one
  entry. Other attributes (``tirx.noalias``, ...) change the lowering, so they stay in the hash.
  The structural hash already ignores buffer, variable and block names.
* ``target``: the normalised target (``hardware.normalize_target``) as sorted JSON.
* ``device``: ``DeviceModel.to_json()`` without ``source`` (where the numbers came from is not a
  number the policy reads): a recalibration or another preset changes the key.
* ``roller``: ``tvm_roller.__version__`` plus a digest of the source folders that decide the tiles
  (``core``, ``hardware``, ``analysis``, ``fusion``, ``backends`` and the planner: an editable
  install keeps its version while the policy changes), and the TVM / tvm-ffi versions.

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

A cached tile can never produce a wrong kernel: a tile only chooses loop splits and annotations, and
the ``s_tir`` schedule primitives preserve the function's semantics or raise. A hit goes through
the planner like a fresh plan (``api.plan_prepared``): the function's op rule validates each
cached tile first (a tile whose splits make no sense can crash TVM natively, so it must never
reach ``apply``), and :func:`cached_schedule` re-plans when applying a cached tile raises.

A function the planner rewrites into independent parts (``api``: a transposed convolution as one
sub-convolution per output parity) has no entry of its own: each part is looked up, validated
and stored under its own key, and the whole is a hit when every part is.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import tvm
import tvm_ffi
from tvm import s_tir

from tvm_roller.analysis import unwrap_func
from tvm_roller.api import (Lowered, Plan, Prepared, lower, plan_parts, plan_prepared, prepare,
                            resolve_target)
from tvm_roller.backends.base import InvalidTile, check_tile_shape
from tvm_roller.core.rtile import RTile
from tvm_roller.core.types import TargetLike
from tvm_roller.hardware import DeviceModel
from tvm_roller.hardware.cache import atomic_write, cache_dir
from tvm_roller.hardware.cpu import plain

logger = logging.getLogger("tvm_roller")

_FORMAT = 1
_MAX_ENTRY_BYTES = 4 << 20  # an entry is a few KB; anything far bigger is not ours
_STALE_TMP_S = 3600.0  # a temporary file this old belongs to a writer that died
_TMP_SUFFIX = ".tmp"
# Attributes that only name a function; dropped before hashing (see the module doc).
_NAME_ATTRS = ("global_symbol",)
# What applying an unsuitable tile raises: TVM 0.27 has no common TVMError base; FFI errors
# arrive as RuntimeError subclasses (ScheduleError, InternalError) or ValueError/TypeError/
# IndexError, and backends/cpu/lower.py's own index arithmetic raises the rest.
_APPLY_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, KeyError, ZeroDivisionError)


class CacheWarning(UserWarning):
    """A schedule cache entry was unreadable or unusable: ignored, and the function re-planned."""


class _BadEntry(InvalidTile):
    """An entry file that cannot be used (the message says why)."""


@dataclass(frozen=True)
class _Key:
    digest: str
    material: Dict[str, Any]  # JSON-native, as stored in (and compared with) the file


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# The source folders whose code decides the tiles: every layer up to the planner (whole folders
# and the planner module, so no file is forgotten). Target and device normalisation results are
# in the key themselves.
_TILE_CODE = ("core", "hardware", "analysis", "fusion", "backends", "api.py")


@functools.lru_cache(maxsize=None)
def roller_code_digest(parts: Tuple[str, ...] = _TILE_CODE) -> str:
    """sha256 over the source of ``parts`` of the package (files or directories; "." is all of
    it), once per process (~1 ms): an editable install keeps ``__version__`` while its policy or
    lowering changes, and must not keep serving the old tiles."""
    root = Path(__file__).resolve().parent
    files = []
    for rel in parts:
        p = root / rel
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        if path.is_file():  # absent in this install: its name alone enters the digest
            h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def context_material(tgt: tvm.target.Target, device: DeviceModel,
                     code: Tuple[str, ...] = _TILE_CODE) -> Dict[str, Any]:
    """Everything besides the function itself that decides what roller builds: the normalised
    target, the device constants, roller's version and code (``code``: which parts), and TVM's
    version. Shared by this cache and the compiled-module cache."""
    from tvm_roller.core import version  # the attribute, read now (tests monkeypatch it)

    return {
        "target": _target_material(tgt),
        "device": _device_material(device),
        "roller": {"version": version.__version__, "code": roller_code_digest(code)},
        "tvm": {"tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__},
    }


def material_digest(material: Dict[str, Any]) -> str:
    """The hex sha256 of key material (canonical JSON)."""
    return _sha256(_canonical(material))


def func_fingerprint(func) -> Dict[str, Any]:
    """The function part of the key material: structural hash (name attributes removed) and the
    parameters' dtypes/shapes (a cheap second discriminator next to a 64-bit hash)."""
    f = unwrap_func(func)
    attrs = f.attrs
    for name in _NAME_ATTRS:
        if attrs is not None and name in attrs:
            f = f.without_attr(name)
    params = []
    for p in f.params:
        # in 0.27 a buffer parameter is a Var with a BufferType (shape + dtype); scalars have none
        shape = getattr(getattr(p, "ty", None), "shape", None)
        params.append([str(p.dtype), None if shape is None else [str(d) for d in shape]])
    return {"hash": f"{tvm_ffi.structural_hash(f):016x}", "params": params}


def _target_material(tgt: tvm.target.Target) -> Any:
    # export() holds tvm_ffi Map/Array (json would fall back to their str): make them plain
    return plain(tgt.export())


def _device_material(device: DeviceModel) -> Dict[str, Any]:
    d = json.loads(device.to_json())
    d.pop("source", None)  # provenance only; the numbers are what matter
    return d


# -- the cache -------------------------------------------------------------------------------------
class ScheduleCache:
    """Per-key JSON files of planned rTiles under ``directory`` (default ``cache_dir()/schedules``).

    ``get``/``put`` never crash on a bad file; ``put`` raises OSError when the directory cannot be
    written (``cached_plan`` turns that into a warning). ``stats()`` counts this instance's
    lookups: ``hits`` are entries that were used, ``misses`` every lookup that ended in planning
    (including ``corrupt`` files and ``stale`` tiles). The files are safe to share between
    processes; an instance's counters are not meant to be shared between threads."""

    def __init__(self, directory: Optional[Path] = None):
        self.directory = Path(directory) if directory is not None else cache_dir() / "schedules"
        self._stats = {"hits": 0, "misses": 0, "corrupt": 0, "stale": 0, "writes": 0,
                       "write_errors": 0}

    # -- keys -----------------------------------------------------------------------------------
    def _key(self, func, target: TargetLike, device: Optional[DeviceModel]) -> _Key:
        tgt, dev, _ = resolve_target(target, device)
        material = {"format": _FORMAT, "func": func_fingerprint(func),
                    **context_material(tgt, dev)}
        material = json.loads(_canonical(material))  # exactly what a file round-trip gives back
        return _Key(material_digest(material), material)

    def key(self, func, target: TargetLike, device: Optional[DeviceModel]) -> str:
        """The hex sha256 naming ``func``'s entry for this target and device."""
        return self._key(func, target, device).digest

    def _path(self, digest: str) -> Path:
        return self.directory / digest[:2] / f"{digest}.json"

    def path(self, func, target: TargetLike, device: Optional[DeviceModel]) -> Path:
        """Where ``func``'s entry lives (it may not exist)."""
        return self._path(self.key(func, target, device))

    # -- reading --------------------------------------------------------------------------------
    def get(self, func, target: TargetLike, device: Optional[DeviceModel],
            topk: int = 1) -> Optional[List[RTile]]:
        """The cached top-``topk`` tiles, or None (a miss; a bad file also warns and is removed).
        An entry planned with a smaller topk than asked for is a miss too."""
        return self._get(self._key(func, target, device), topk)

    def _get(self, k: _Key, topk: int = 1) -> Optional[List[RTile]]:
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

    def invalidate(self, func, target: TargetLike, device: Optional[DeviceModel]) -> bool:
        """Remove ``func``'s entry; True if there was one."""
        try:
            os.unlink(self.path(func, target, device))
            return True
        except FileNotFoundError:
            return False

    # -- writing --------------------------------------------------------------------------------
    def put(self, func, target: TargetLike, device: Optional[DeviceModel], tiles: List[RTile],
            topk: Optional[int] = None) -> None:
        """Store ``tiles`` (best first) for ``func``; ``topk``: how many were asked for (default
        ``len(tiles)``; the policy may return fewer). Atomic; raises OSError if not writable."""
        self._put(self._key(func, target, device), tiles, topk)

    def _put(self, k: _Key, tiles: List[RTile], topk: Optional[int] = None) -> None:
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
        entry["checksum"] = _sha256(_canonical(entry))
        path = self._path(k.digest)
        try:
            _atomic_write_text(path, json.dumps(entry, sort_keys=True, indent=1))
        except OSError:
            self._stats["write_errors"] += 1
            raise
        self._stats["writes"] += 1
        _sweep_stale_tmp(path.parent)

    def stats(self) -> dict:
        """Counts of this instance: hits, misses (incl. corrupt), corrupt, stale, writes,
        write_errors."""
        return dict(self._stats)


def _parse_entry(raw: bytes, k: _Key) -> Tuple[List[RTile], int]:
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
    if checksum != _sha256(_canonical(entry)):
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
        check_tile_shape(t)
    return tiles, topk


def _atomic_write_text(path: Path, text: str) -> None:
    # no fsync: after a power cut an entry may be empty or truncated, which the checksum turns
    # into a miss, and a compile writing hundreds of entries should not wait for the disk
    atomic_write(path, text.encode("utf-8"), suffix=_TMP_SUFFIX)


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


# -- planning through the cache --------------------------------------------------------------------
def _cached_plan(func, target: TargetLike, topk: int, device: Optional[DeviceModel],
                 cache: ScheduleCache) -> Tuple[Plan, List[_Key]]:
    """The plan of ``func`` through the cache: a hit's tiles go through the same planner
    (``plan_prepared``), which validates them with the function's rule; a miss plans and
    stores. ``Plan.from_cache`` tells which. Also the keys the plan was looked up under: one,
    or one per part of a function the planner decomposes (each part has its own entry)."""
    prep = prepare(func, target, device)  # raises UnsupportedError exactly as plan() would
    return _cached_prepared(prep, topk, cache)


def _cached_prepared(prep: Prepared, topk: int, cache: ScheduleCache
                     ) -> Tuple[Plan, List[_Key]]:
    if prep.parts:  # each part through the cache, under its own key
        got = [_cached_prepared(part, topk, cache) for part in prep.parts]
        return plan_parts(prep, [p for p, _ in got]), [k for _, keys in got for k in keys]
    k = cache._key(prep.analysis.func, prep.target, prep.device)
    tiles = cache._get(k, topk)
    if tiles is not None:
        names = [a.name for a in prep.analysis.axes]  # names are not in the hash: this func's
        tiles = [dataclasses.replace(t, axes=list(names)) for t in tiles]
        try:
            return plan_prepared(prep, topk, tiles), [k]
        except InvalidTile as err:
            cache._discard(cache._path(k.digest), f"tile does not fit the function: {err}",
                           "stale")
    return _plan_and_store(prep, cache, k, topk), [k]


def _replan(prep: Prepared, cache: ScheduleCache, topk: int) -> Plan:
    """Plan afresh and store (every part of a decomposed function under its own key)."""
    if prep.parts:
        return plan_parts(prep, [_replan(part, cache, topk) for part in prep.parts])
    return _plan_and_store(prep, cache, cache._key(prep.analysis.func, prep.target,
                                                   prep.device), topk)


def _plan_and_store(prep: Prepared, cache: ScheduleCache, k: _Key, topk: int) -> Plan:
    p = plan_prepared(prep, topk)
    try:
        for t in p.tiles:
            p.rule.validate(t, p.analysis, p.device)
    except InvalidTile as err:
        # a fresh tile the cache would reject on reading: don't store it (and don't warn the
        # user each compile); the plan itself is used as is
        logger.debug("not caching the plan of %s: %s", k.digest, err)
        return p
    try:
        cache._put(k, list(p.tiles), topk)
    except OSError as err:
        warnings.warn(f"cannot write the schedule cache in {cache.directory} ({err}); "
                      "continuing without it", CacheWarning, stacklevel=4)
    return p


def cached_plan(func, target: TargetLike, topk: int = 1, device: Optional[DeviceModel] = None,
                cache: Optional[ScheduleCache] = None) -> Plan:
    """``plan()`` through the cache: a hit rebuilds the Plan from the analysis and the cached
    tiles without running the policy; a miss plans and stores. ``cache``: default
    ``ScheduleCache()``. Use :func:`cached_schedule` to also guard ``apply``."""
    cache = cache if cache is not None else ScheduleCache()
    return _cached_plan(func, target, topk, device, cache)[0]


@dataclass(frozen=True)
class CachedSchedule:
    plan: Plan
    lowered: Lowered
    from_cache: bool  # the tile came from the cache (False: planned now)

    @property
    def schedule(self) -> s_tir.Schedule:
        return self.lowered.schedule


def cached_schedule(func, target: TargetLike, device: Optional[DeviceModel] = None,
                    cache: Optional[ScheduleCache] = None) -> CachedSchedule:
    """Plan through the cache and apply the best tile. If a cached tile fails to apply (e.g.
    written by a lowering that has since changed), warn, drop the entry, re-plan and store."""
    cache = cache if cache is not None else ScheduleCache()
    p, keys = _cached_plan(func, target, 1, device, cache)
    # a decomposed function: some parts may come from the cache, others planned now
    cached = p.from_cache or any(part.from_cache for part in p.parts)
    if not cached:
        return CachedSchedule(p, lower(p, p.tiles[0]), False)
    try:
        return CachedSchedule(p, lower(p, p.tiles[0]), p.from_cache)
    except _APPLY_ERRORS as err:
        for k in [k for part, k in zip(p.parts or (p,), keys) if part.from_cache]:
            cache._discard(cache._path(k.digest),
                           f"cached tile failed to apply: {type(err).__name__}: {err}", "stale")
    p = _replan(prepare(func, target, device), cache, 1)
    return CachedSchedule(p, lower(p, p.tiles[0]), False)
