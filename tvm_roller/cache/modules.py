"""Persistent cache of whole compiled Relax modules: compiling the same model again is a load.

Layout: ``<cache_dir()>/modules/<key>.json`` (metadata) next to ``<key>.<sha16>.so`` (the library
``export_library`` wrote, named by its own content hash). The key is the sha256 of: the Relax
module's structural hash (constants included), the normalised target, the device constants, roller's
version and code digest (see :mod:`tvm_roller.cache.keys`) and the pipeline options.

The metadata names the library file and its sha256; a library is only loaded after its bytes match,
so a truncated or foreign file (or metadata pointing at one) is a miss, warned about and removed,
never a crash or a wrong kernel. Both files are written atomically; two writers of one key each
write a complete library under its own content name, and the metadata (written last) points at
one of them. A library file is never modified in place (only created and renamed), so a process
that has it loaded is never pulled out from under (an in-place truncation of a mapped library
kills its users with SIGBUS).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import List, Optional, Tuple

import tvm
import tvm_ffi

from tvm_roller.cache.files import atomic_write, cache_dir
from tvm_roller.cache.keys import JsonModel, context_material, material_digest
from tvm_roller.core.errors import CacheWarning

logger = logging.getLogger("tvm_roller")

_FORMAT = 1


class ModuleCache:
    """Compiled Relax executables keyed by (module, target, device, roller, options)."""

    def __init__(self, directory: Optional[Path] = None) -> None:
        self.directory = Path(directory) if directory is not None else cache_dir() / "modules"
        self.hits = self.misses = self.corrupt = 0

    def key(self, mod: tvm.IRModule, tgt: tvm.target.Target, dev: JsonModel,
            options: dict) -> str:
        # all of roller's code, not only the tile-deciding part: the pipeline (the Relax
        # integration and its passes) decides what the library holds too
        return material_digest({"module": f"{tvm_ffi.structural_hash(mod):016x}",
                                **context_material(tgt, dev, code=(".",)), "options": options})

    def load(self, mod, tgt, dev, options: dict) -> Optional[Tuple[tvm.runtime.Module, List[dict]]]:
        """(library, report entries) on a hit, None on a miss."""
        key = self.key(mod, tgt, dev, options)
        meta_path = self.directory / f"{key}.json"
        if not meta_path.is_file():
            self.misses += 1
            return None
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("format") != _FORMAT or meta.get("key") != key:
                raise ValueError("metadata of another key or format")
            lib_path = self.directory / str(meta["library"])
            if lib_path.parent != self.directory:
                raise ValueError("library path outside the cache directory")
            data = lib_path.read_bytes()
            if hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise ValueError("library does not match its checksum")
            lib = tvm.runtime.load_module(str(lib_path))
            entries = list(meta["report"])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RuntimeError) as err:
            # json.JSONDecodeError is a ValueError; TVM's loader raises RuntimeError subclasses
            self.corrupt += 1
            self.misses += 1
            warnings.warn(f"ignoring unusable compiled-module cache entry {meta_path} "
                          f"({type(err).__name__}: {err}); recompiling", CacheWarning, stacklevel=3)
            _remove(meta_path)
            return None
        self.hits += 1
        return lib, entries

    def store(self, mod, tgt, dev, options: dict, executable,
              entries: List[dict]) -> Optional[tvm.runtime.Module]:
        """Export ``executable`` and record it; returns the library written, loaded (its machine
        code was made once, for the file: running ``executable`` itself would JIT-compile the
        whole module again, as long as the export took), or None when writing failed (warned:
        it only costs the cache)."""
        key = self.key(mod, tgt, dev, options)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{key}.", suffix=".so")
            os.close(fd)
            try:
                executable.export_library(tmp)
                digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
                lib_name = f"{key}.{digest[:16]}.so"
                os.replace(tmp, self.directory / lib_name)
            except BaseException:
                _remove(Path(tmp))
                raise
            meta = {"format": _FORMAT, "key": key, "library": lib_name, "sha256": digest,
                    "report": entries}
            atomic_write(self.directory / f"{key}.json", json.dumps(meta).encode("utf-8"))
        except OSError as err:
            warnings.warn(f"could not write the compiled-module cache ({err})", CacheWarning,
                          stacklevel=3)
            return None
        try:
            return tvm.runtime.load_module(str(self.directory / lib_name))
        except RuntimeError as err:  # TVM's loader errors; the caller keeps ``executable``
            warnings.warn(f"could not load the library just written ({err})", CacheWarning,
                          stacklevel=3)
            return None

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "corrupt": self.corrupt}


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass  # another process removed it first
    except OSError as err:
        logger.warning("cannot remove cache file %s: %s", path, err)
