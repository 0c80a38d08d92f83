"""Running a kernel bundle with CuPy and no TVM (the run half of ``gpu_check``, on the GPU
machine): find NVRTC's headers, compile or load the module (NVRTC, else the cubin nvcc built),
and replay the bundle's launches (``Launcher``) with its grids, blocks, dynamic shared memory and
workspaces.

Nothing here may import TVM or the rest of tvm_roller: the GPU machine has neither.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from harness.cuda_check.gpu_manifest import ARCH

STATIC_SMEM_LIMIT = 48 * 1024  # above this a kernel needs the dynamic-smem opt-in attribute


def nvrtc_include_dirs() -> List[str]:
    """Header directories NVRTC needs for TVM's source (``cuda/std/*`` under __CUDACC_RTC__,
    ``mma.h``, ``cuda_fp16.h``): a CUDA toolkit's include (+ its ``cccl``), else the pip
    ``nvidia-*`` wheels', else CuPy's bundled CCCL. One CCCL only: two versions would clash."""
    import glob
    import site

    roots = [os.environ.get(v) for v in ("CUDA_PATH", "CUDA_HOME")] + ["/usr/local/cuda"]
    cands: List[str] = []
    for r in filter(None, roots):
        cands += [os.path.join(r, "include"), *glob.glob(os.path.join(r, "targets", "*", "include"))]
    sites = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    for sp in sites:
        cands += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "include")))
        cands += sorted(glob.glob(os.path.join(sp, "nvidia", "cu*", "include")))
    for sp in sites:
        cands += sorted(glob.glob(os.path.join(sp, "cupy", "_core", "include", "cupy", "_cccl",
                                               "libcudacxx")))
    out: List[str] = []
    seen: set = set()
    have_cccl = False
    for c in cands:
        for d in (c, os.path.join(c, "cccl")):
            if not os.path.isdir(d) or os.path.realpath(d) in seen:
                continue
            seen.add(os.path.realpath(d))
            is_cccl = os.path.isfile(os.path.join(d, "cuda", "std", "cstdint"))
            has_other = any(os.path.isfile(os.path.join(d, h))
                            for h in ("mma.h", "cuda_fp16.h", "cuda_runtime.h"))
            if is_cccl and not have_cccl:
                out.append(d)
                have_cccl = True
            elif has_other and not is_cccl:
                out.append(d)
    return out


def load_module(cp: Any, source: str, arch: str, kernel: str,
                cubin_path: Optional[str] = None) -> Tuple[Any, str]:
    """A CuPy module for ``source``: NVRTC with ``-arch`` (what was asked for), NVRTC with CuPy's
    own arch option only (some CuPy/NVRTC versions reject a second -arch), then the cubin nvcc
    built at ``build`` time. CuPy compiles lazily, so ``get_function(kernel)`` forces it inside
    the attempt. Returns (module, how); the first way that works is tried first next time."""
    if "inc" not in _LOAD_PREF:
        _LOAD_PREF["inc"] = tuple(f"-I{d}" for d in nvrtc_include_dirs())
    opts: Tuple[str, ...] = _LOAD_PREF["inc"] + (
        "-D__NV_SILENCE_DEPRECATION_BEGIN=", "-D__NV_SILENCE_DEPRECATION_END=")
    if re.search(r"\bINFINITY\b", source):  # nvcc gets it from <math.h>, NVRTC has none
        opts += ("-DINFINITY=__int_as_float(0x7f800000)",)
    attempts: List[Tuple[str, Callable[[], Any]]] = [
        (f"nvrtc -arch={arch}", lambda: cp.RawModule(code=source, options=(f"-arch={arch}",) + opts)),
        ("nvrtc", lambda: cp.RawModule(code=source, options=opts)),
    ]
    if cubin_path:
        attempts.append(("cubin", lambda: cp.RawModule(path=cubin_path)))
    attempts.sort(key=lambda a: a[0] != _LOAD_PREF.get("how"))
    errors = []
    for how, make in attempts:
        try:
            mod = make()
            mod.get_function(kernel)
            _LOAD_PREF["how"] = how
            return mod, how
        except Exception as err:  # noqa: BLE001
            errors.append(f"{how}: {type(err).__name__}: {str(err).strip()[-600:]}")
    raise RuntimeError("cannot load the CUDA module; " + " | ".join(errors))


_LOAD_PREF: Dict[str, Any] = {}


class Launcher:
    """Runs a kernel bundle (the dict of ``KernelBundle.to_json``) with CuPy, no TVM.

    ``params`` are the entry function's arguments in order: device arrays (CuPy arrays, or
    anything CuPy accepts as a pointer argument) for buffers, numbers for scalars. Workspaces
    are allocated once as raw bytes (the kernels only need the pointer; TVM does not clear
    them either) and reused by every call; all launches go to CuPy's current stream."""

    def __init__(self, bundle: Dict[str, Any], cp: Any, arch: str = ARCH,
                 cubin_path: Optional[str] = None, module: Optional[Tuple[Any, str]] = None):
        self.cp = cp
        self.bundle = bundle
        launches = bundle["launches"]
        if not launches:
            raise ValueError("the bundle launches no kernel")
        # ``module``: (module, how) from ``load_module`` when it was compiled ahead
        self.module, self.how = module or load_module(cp, bundle["source"], arch,
                                                      launches[0]["name"], cubin_path)
        self.functions: Dict[str, Any] = {}
        for launch in launches:
            name = launch["name"]
            if name not in self.functions:
                fn = self.module.get_function(name)
                smem = max(int(l["dyn_smem_bytes"]) for l in launches if l["name"] == name)
                if smem > STATIC_SMEM_LIMIT:  # opt in to more than 48 KB of dynamic smem
                    fn.max_dynamic_shared_size_bytes = smem
                self.functions[name] = fn
        self.workspaces = [cp.empty((max(1, _nbytes(w["dtype"], w["count"])),), dtype=cp.uint8)
                           for w in bundle["workspaces"]]

    def prepare(self, params: Sequence[Any]) -> List[Tuple[Any, tuple, tuple, tuple, int]]:
        """The launches with ``params`` bound: [(function, grid, block, args, dyn smem)]."""
        specs = self.bundle["params"]
        if len(params) != len(specs):
            raise ValueError(f"{len(params)} arguments for {len(specs)} parameters")
        out = []
        for launch in self.bundle["launches"]:
            args = []
            for a in launch["args"]:
                if a["kind"] == "param":
                    v = params[a["index"]]
                    scalar = specs[a["index"]]["kind"] == "scalar"
                    args.append(np.dtype(a["dtype"]).type(v) if scalar else v)
                elif a["kind"] == "workspace":
                    args.append(self.workspaces[a["index"]])
                elif a["kind"] == "scalar":
                    args.append(np.dtype(a["dtype"]).type(a["value"]))
                else:
                    raise ValueError(f"unknown kernel argument kind {a['kind']!r}")
            out.append((self.functions[launch["name"]], tuple(launch["grid"]), tuple(launch["block"]),
                        tuple(args), int(launch["dyn_smem_bytes"])))
        return out

    @staticmethod
    def launch(prepared: Sequence[Tuple[Any, tuple, tuple, tuple, int]]) -> None:
        for fn, grid, block, args, smem in prepared:
            fn(grid, block, args, shared_mem=smem)

    def __call__(self, params: Sequence[Any]) -> None:
        self.launch(self.prepare(params))


def _nbytes(dtype: str, count: int) -> int:
    bits = {"bool": 8}.get(dtype)
    if bits is None:
        digits = "".join(ch for ch in dtype.split("x")[0] if ch.isdigit())
        lanes = int(dtype.split("x")[1]) if "x" in dtype else 1
        bits = int(digits or 32) * lanes
    return (bits * int(count) + 7) // 8
