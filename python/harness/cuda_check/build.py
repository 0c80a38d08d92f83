"""The toolchain around a scheduled CUDA module, whoever scheduled it.

No GPU is needed for any of this:

* ``lower``            TVM's own s_tir pipeline, stopped right after ``SplitHostDevice``: the host
                       function still has its buffer parameters and calls each device kernel
                       (a separate PrimFunc) with ``call_ffi_kernel``.
* ``kernel_launches``  a :class:`KernelBundle`: the CUDA source ``tvm.compile`` generates and, in
                       the host's order, every launch (kernel, grid, block, dynamic shared memory,
                       arguments). Enough to run the module with CuPy and no TVM.
* ``verify``           ``verify_gpu_code`` and shared-memory totals per device kernel.
* ``compile_cubin``    nvcc + ``ptxas -v`` per kernel (registers, spills, stack, static smem);
  ``ptx_tensor_core``  whether the PTX uses tensor cores. Both are cached on disk.
* ``check``            all of the above in one :class:`CheckReport`.

``tvm.compile`` for CUDA only generates source here (no libcuda): invalid CUDA, e.g. vectors
wider than 16 bytes, is caught by ``verify`` or by nvcc, never by TVM.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import tvm
from tvm import tirx

from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.types import TargetLike
from tvm_roller.hardware import gpu
from tvm_roller.hardware.calibration_store import atomic_write, cache_dir
from tvm_roller.hardware.model import DeviceModel, dtype_bytes

ModLike = Union[tvm.IRModule, tirx.PrimFunc, "tvm.s_tir.Schedule"]

BUNDLE_FORMAT = 1
_CACHE_FORMAT = 1
_DEVICE_KERNEL_LAUNCH = 2  # CallingConv::kDeviceKernelLaunch
_DYN_SMEM_TAG = "tirx.use_dyn_shared_memory"
_GRID_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
_BLOCK_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
# PTX instructions that only tensor cores execute (sm_80 mma/ldmatrix, WMMA, sm_90a wgmma)
_TENSOR_CORE_PTX = re.compile(r"\b(mma\.sync|wmma\.mma|ldmatrix|wgmma\.mma_async)\b")


class CudaCompileError(UnsupportedError):
    """nvcc (or ptxas) rejected the CUDA source; the message has nvcc's error lines and ``log``
    the whole output."""

    def __init__(self, message: str, log: str = "", returncode: Optional[int] = None):
        super().__init__(message)
        self.log = log
        self.returncode = returncode


# -- plain data (JSON round trip) ---------------------------------------------------------------
@dataclass
class ParamSpec:
    """One parameter of the entry function: a buffer (shape, dtype) or a scalar (shape [])."""

    name: str
    shape: List[int]
    dtype: str
    kind: str = "buffer"  # "buffer" | "scalar"


@dataclass
class Workspace:
    """A global buffer the host allocates for intermediates passed between kernels."""

    name: str
    dtype: str
    count: int  # elements

    @property
    def nbytes(self) -> int:
        return self.count * dtype_bytes(self.dtype)


@dataclass
class KernelArg:
    """One kernel argument, in the kernel's parameter order.

    ``param``: the entry function's parameter ``index`` (its data pointer, or its value for a
    scalar parameter); ``workspace``: ``KernelBundle.workspaces[index]``; ``scalar``: ``value``
    of ``dtype`` (the kernel parameter's type)."""

    kind: str  # "param" | "workspace" | "scalar"
    index: int = -1
    dtype: str = ""
    value: Optional[Union[int, float]] = None
    name: str = ""


@dataclass
class KernelLaunch:
    name: str  # the __global__ function's name in the source (extern "C", unmangled)
    grid: Tuple[int, int, int]
    block: Tuple[int, int, int]
    dyn_smem_bytes: int
    args: List[KernelArg]

    @property
    def threads(self) -> int:
        return math.prod(self.block)


@dataclass
class KernelBundle:
    """Everything needed to run a lowered module without TVM: allocate ``workspaces`` (TVM does
    not initialise them either), then launch ``launches`` in order on one stream with the entry
    function's buffers (``params``) as arguments."""

    source: str
    arch: str
    params: List[ParamSpec]
    workspaces: List[Workspace]
    launches: List[KernelLaunch]
    format: int = BUNDLE_FORMAT

    def to_json(self, indent: Optional[int] = None) -> str:
        return json.dumps(asdict(self), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "KernelBundle":
        d = json.loads(text)
        if d.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"not a format-{BUNDLE_FORMAT} kernel bundle (format {d.get('format')})")
        return cls(
            source=d["source"], arch=d["arch"],
            params=[ParamSpec(**p) for p in d["params"]],
            workspaces=[Workspace(**w) for w in d["workspaces"]],
            launches=[KernelLaunch(name=l["name"], grid=tuple(l["grid"]), block=tuple(l["block"]),
                                   dyn_smem_bytes=int(l["dyn_smem_bytes"]),
                                   args=[KernelArg(**a) for a in l["args"]])
                      for l in d["launches"]],
            format=d["format"])

    @property
    def kernel_names(self) -> List[str]:
        """Distinct kernels in launch order."""
        return list(dict.fromkeys(l.name for l in self.launches))


@dataclass
class KernelResources:
    """What ``ptxas -v`` reports for one entry function."""

    name: str
    registers: int = 0
    spill_stores: int = 0  # bytes
    spill_loads: int = 0  # bytes
    stack_frame: int = 0  # bytes
    smem_static: int = 0  # bytes of static __shared__ (dynamic shared memory is not counted)
    barriers: int = 0
    cmem: int = 0  # bytes of cmem[0] (kernel parameters and constants)


@dataclass
class PtxasReport:
    arch: str
    nvcc_version: str
    kernels: Dict[str, KernelResources]
    warnings: List[str] = field(default_factory=list)  # ptxas warnings (e.g. spills)
    cubin_path: Optional[str] = None  # the cached cubin; set on every return, not stored

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "PtxasReport":
        d = json.loads(text)
        d["kernels"] = {k: KernelResources(**v) for k, v in d["kernels"].items()}
        return cls(**d)


@dataclass
class CheckReport:
    arch: str
    source: str
    problems: List[str]  # verify_gpu_code / shared memory / nvcc failures; empty when fine
    ptxas: Optional[PtxasReport]  # None when nvcc failed (the reason is in ``problems``)
    tensor_core: bool
    bundle: Optional[KernelBundle] = None

    @property
    def ok(self) -> bool:
        return not self.problems and self.ptxas is not None

    def ok_for_compute_bound(self) -> bool:
        """Fit for a compute-bound kernel: compiled, no problems, and no kernel spills registers
        or uses a stack frame (local-memory traffic would dominate)."""
        return self.ok and all(k.spill_stores == 0 and k.stack_frame == 0
                               for k in self.ptxas.kernels.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "CheckReport":
        d = json.loads(text)
        if d["ptxas"] is not None:
            d["ptxas"] = PtxasReport.from_json(json.dumps(d["ptxas"]))
        if d["bundle"] is not None:
            d["bundle"] = KernelBundle.from_json(json.dumps(d["bundle"]))
        return cls(**d)


# -- lowering ----------------------------------------------------------------------------------
def _as_module(mod: ModLike) -> tvm.IRModule:
    if isinstance(mod, tvm.IRModule):
        return mod
    if isinstance(mod, tirx.PrimFunc):
        return tvm.IRModule({"main": mod})
    if isinstance(mod, tvm.s_tir.Schedule):
        return mod.mod
    raise TypeError(f"expected an IRModule, PrimFunc or s_tir.Schedule, got {type(mod).__name__}")


def _cuda_target(target: TargetLike) -> tvm.target.Target:
    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    if tgt.kind.name != "cuda":
        raise UnsupportedError(f"target kind {tgt.kind.name!r} is not cuda")
    gpu.target_cc(tgt)  # raises when there is no arch: nvcc needs one
    return tgt if tgt.host is not None else tgt.with_host("llvm")


@contextmanager
def _capture_after(pass_name: str) -> Iterator[Dict[str, tvm.IRModule]]:
    """Run inside a PassContext that keeps the caller's settings (config, opt level, passes,
    instruments) and records the module after ``pass_name``. Capturing from the real pipeline
    keeps us exactly on what ``tvm.compile`` does instead of a copied pass list."""
    seen: Dict[str, tvm.IRModule] = {}

    @tvm.instrument.pass_instrument
    class _Capture:
        def run_after_pass(self, mod, info):
            if info.name == pass_name:
                seen["mod"] = mod

    cur = tvm.transform.PassContext.current()
    ctx = tvm.transform.PassContext(
        opt_level=cur.opt_level, required_pass=list(cur.required_pass),
        disabled_pass=list(cur.disabled_pass), instruments=list(cur.instruments) + [_Capture()],
        config=dict(cur.config))
    with ctx:
        yield seen
    if "mod" not in seen:
        raise UnsupportedError(f"TVM's pipeline did not run {pass_name}; cannot find the kernels")


def lower(mod: ModLike, target: TargetLike) -> tvm.IRModule:
    """``mod`` through TVM's s_tir pipeline (what ``tvm.compile`` runs for CUDA) up to and
    including ``SplitHostDevice``: device kernels are separate PrimFuncs (``calling_conv`` 2)
    and the host function still has its buffer parameters."""
    tgt = _cuda_target(target)
    pipe, _, _ = tirx.get_tir_pipeline("s_tir")
    with _capture_after("tirx.SplitHostDevice") as seen:
        pipe(tirx.transform.BindTarget(tgt)(_as_module(mod)))
    return seen["mod"]


def _lower_and_source(mod: ModLike, target: TargetLike) -> Tuple[tvm.IRModule, str]:
    """One ``tvm.compile``: the split module (as ``lower``) and the generated CUDA source."""
    tgt = _cuda_target(target)
    with _capture_after("tirx.SplitHostDevice") as seen:
        ex = tvm.compile(_as_module(mod), target=tgt)
    imports = ex.mod.imports
    if not imports:
        raise UnsupportedError("tvm.compile produced no device module (no kernel was launched)")
    return seen["mod"], imports[0].inspect_source()


def device_kernels(lowered: tvm.IRModule) -> Dict[str, tirx.PrimFunc]:
    """Device kernels of a lowered module by their symbol in the source."""
    out = {}
    for gv, f in lowered.functions_items():
        if isinstance(f, tirx.PrimFunc) and int(f.attrs.get("calling_conv", 0)) == _DEVICE_KERNEL_LAUNCH:
            out[str(f.attrs.get("global_symbol", gv.name_hint))] = f
    return out


def _entry(lowered: tvm.IRModule) -> tirx.PrimFunc:
    host = [f for f in lowered.functions.values() if isinstance(f, tirx.PrimFunc)
            and int(f.attrs.get("calling_conv", 0)) != _DEVICE_KERNEL_LAUNCH]
    entry = [f for f in host if f.attrs.get("tirx.is_entry_func")]
    if len(entry) == 1:
        return entry[0]
    if len(host) == 1:
        return host[0]
    raise UnsupportedError(f"the module has {len(host)} host functions; give it one entry function")


# -- launches from the host function ------------------------------------------------------------
def _is_buffer_var(v: Any) -> bool:
    return isinstance(v, tirx.Var) and isinstance(getattr(v, "ty", None), tirx.BufferType)


def _name(v: Any) -> str:
    return str(getattr(v, "name", None) or v)


class _HostWalker:
    """Reads the host function's straight-line launch sequence. Anything else on the host
    (loops, branches, stores) could not be replayed without TVM and is refused by name."""

    def __init__(self, entry: tirx.PrimFunc, kernels: Dict[str, tirx.PrimFunc]):
        self.kernels = kernels
        self.params: List[ParamSpec] = []
        self.param_of: Dict[Any, int] = {}
        for i, p in enumerate(entry.params):
            if _is_buffer_var(p):
                self.params.append(ParamSpec(_name(p), [_int(d, "shape") for d in p.ty.shape],
                                             str(p.ty.dtype)))
            else:
                self.params.append(ParamSpec(_name(p), [], str(p.dtype), kind="scalar"))
            self.param_of[p] = i
        self.workspaces: List[Workspace] = []
        self.workspace_of: Dict[Any, int] = {}
        self.alias: Dict[Any, Any] = {}  # declared view -> the expression its data comes from
        self.env: Dict[Any, Union[int, float]] = {}  # host scalars bound with Bind
        self.launches: List[KernelLaunch] = []
        self.walk(entry.body)

    def walk(self, s: Any) -> None:
        if isinstance(s, tirx.SeqStmt):
            for x in s.seq:
                self.walk(x)
        elif isinstance(s, tirx.AllocBuffer):
            b = s.buffer
            scope = str(b.ty.storage_scope or "global")
            if scope != "global":
                raise UnsupportedError(f"host allocates {_name(b)} in scope {scope!r}")
            names = {w.name for w in self.workspaces}
            name, k = _name(b), 1
            while name in names:  # two allocations may share a name hint
                name, k = f"{_name(b)}_{k}", k + 1
            count = math.prod(_int(d, "workspace shape") for d in b.ty.shape)
            self.workspace_of[b] = len(self.workspaces)
            self.workspaces.append(Workspace(name, str(b.ty.dtype), count))
        elif isinstance(s, tirx.DeclBuffer):
            self.alias[s.buffer] = s.data
        elif isinstance(s, tirx.Bind):
            self.env[s.var] = self.value(s.value)
        elif isinstance(s, tirx.AssertStmt):
            pass  # a check, nothing to replay
        elif isinstance(s, tirx.AttrStmt):
            self.walk(s.body)
        elif isinstance(s, tirx.Evaluate):
            call = s.value
            op = getattr(getattr(call, "op", None), "name", "")
            if op != "tirx.call_ffi_kernel":
                raise UnsupportedError(f"host code {op or type(call).__name__} between kernel "
                                       "launches cannot be replayed without TVM")
            self.launch(call)
        elif s is None:
            pass
        else:
            raise UnsupportedError(f"host statement {type(s).__name__} between kernel launches "
                                   "cannot be replayed without TVM")

    def value(self, e: Any) -> Union[int, float]:
        """A host expression's value (constants and bound scalars, simple arithmetic)."""
        if isinstance(e, (int, float)):
            return e
        if isinstance(e, tirx.IntImm):
            return int(e.value)
        if isinstance(e, tirx.FloatImm):
            return float(e.value)
        if isinstance(e, tirx.Var) and e in self.env:
            return self.env[e]
        if isinstance(e, tirx.Cast):
            v = self.value(e.value)
            return float(v) if "float" in str(e.dtype) else int(v)
        binop = {tirx.Add: lambda a, b: a + b, tirx.Sub: lambda a, b: a - b,
                 tirx.Mul: lambda a, b: a * b, tirx.FloorDiv: lambda a, b: a // b,
                 tirx.FloorMod: lambda a, b: a % b, tirx.Min: min, tirx.Max: max}
        for cls, fn in binop.items():
            if isinstance(e, cls):
                return fn(self.value(e.a), self.value(e.b))
        raise UnsupportedError(f"host value {e} is not a constant; dynamic launches are not "
                               "supported")

    def pointer(self, e: Any) -> Tuple[str, int, str]:
        """(kind, index, name) of the buffer whose data pointer ``e`` is."""
        seen = 0
        while True:
            seen += 1
            if seen > 64:
                raise UnsupportedError(f"cannot resolve kernel argument {e}")
            if getattr(getattr(e, "op", None), "name", "") == "tirx.buffer_data":
                e = e.args[0]
                continue
            if e in self.param_of:
                return "param", self.param_of[e], self.params[self.param_of[e]].name
            if e in self.workspace_of:
                i = self.workspace_of[e]
                return "workspace", i, self.workspaces[i].name
            if e in self.alias:
                e = self.alias[e]
                continue
            raise UnsupportedError(f"kernel argument {e} is not a parameter's or a host "
                                   "allocation's data pointer")

    def launch(self, call: Any) -> None:
        name = str(call.args[0].value)
        tags = [str(t) for t in call.attrs.launch_params]
        nargs = len(call.args) - 1 - len(tags)
        kern = self.kernels.get(name)
        if kern is None:
            raise UnsupportedError(f"the host launches {name}, which is not a device kernel")
        if len(kern.params) != nargs:
            raise UnsupportedError(f"{name}: {nargs} arguments for {len(kern.params)} parameters")
        args: List[KernelArg] = []
        for kp, a in zip(kern.params, call.args[1:1 + nargs]):
            is_ptr = isinstance(getattr(kp, "ty", None), tvm.ir.PointerType)
            if is_ptr:
                kind, idx, nm = self.pointer(a)
                elem = kp.ty.element_type
                args.append(KernelArg(kind, idx, str(getattr(elem, "dtype", elem)), name=nm))
            elif isinstance(a, tirx.Var) and a in self.param_of:
                args.append(KernelArg("param", self.param_of[a], str(kp.dtype), name=_name(a)))
            else:
                args.append(KernelArg("scalar", dtype=str(kp.dtype), value=self.value(a),
                                      name=_name(kp)))
        grid, block, dyn = [1, 1, 1], [1, 1, 1], 0
        for tag, v in zip(tags, call.args[1 + nargs:]):
            val = int(self.value(v))
            if tag in _GRID_TAGS:
                grid[_GRID_TAGS.index(tag)] = val
            elif tag in _BLOCK_TAGS:
                block[_BLOCK_TAGS.index(tag)] = val
            elif tag == _DYN_SMEM_TAG:
                dyn = val
            else:
                raise UnsupportedError(f"{name}: launch parameter {tag!r} is not supported")
        self.launches.append(KernelLaunch(name, tuple(grid), tuple(block), dyn, args))


def _int(e: Any, what: str) -> int:
    if isinstance(e, (int, tirx.IntImm)):
        return int(e)
    raise UnsupportedError(f"{what} {e} is not a constant; dynamic shapes are not supported")


def _bundle(lowered: tvm.IRModule, source: str, arch: str) -> KernelBundle:
    kernels = device_kernels(lowered)
    walker = _HostWalker(_entry(lowered), kernels)
    for launch in walker.launches:
        if not re.search(r"__global__\s+void\s+(?:__launch_bounds__\(\s*\d+\s*\)\s+)?"
                         + re.escape(launch.name) + r"\s*\(", source):
            raise UnsupportedError(f"kernel {launch.name} is launched but not in the CUDA source")
    return KernelBundle(source, arch, walker.params, walker.workspaces, walker.launches)


def kernel_launches(mod: ModLike, target: TargetLike) -> KernelBundle:
    """The CUDA source of ``mod`` and every kernel launch of its entry function, in order.

    Raises ``UnsupportedError`` for what a plain launcher cannot replay: dynamic shapes, host
    loops or branches around launches, launch flags other than grid/block/dynamic smem."""
    tgt = _cuda_target(target)
    lowered, source = _lower_and_source(mod, tgt)
    return _bundle(lowered, source, gpu.target_cc(tgt).arch)


# -- verification ------------------------------------------------------------------------------
def _verify_lowered(lowered: tvm.IRModule, dev: DeviceModel) -> List[str]:
    from tvm.s_tir.analysis import calculate_allocated_bytes, verify_gpu_code

    constraints = gpu.verify_constraints(dev)
    limit = gpu.smem_limit(dev)
    problems = []
    for name, kern in device_kernels(lowered).items():
        if not verify_gpu_code(kern, constraints):
            # verify_gpu_code only says yes/no: find which limit by checking them one at a time
            failed = [k for k, v in constraints.items() if not verify_gpu_code(kern, {k: v})]
            which = ", ".join(f"{k}={constraints[k]}" for k in failed) or "combined limits"
            problems.append(f"{name}: verify_gpu_code failed ({which})")
        alloc = {str(k): int(v) for by_func in calculate_allocated_bytes(kern).values()
                 for k, v in by_func.items()}
        smem = sum(v for k, v in alloc.items() if k.startswith("shared"))
        if smem > limit:
            problems.append(f"{name}: {smem} bytes of shared memory > {limit} per block on {dev.name}")
        static = alloc.get("shared", 0)  # __shared__ arrays: no opt-in above the static limit
        if static > dev.gpu.smem_per_block:
            problems.append(f"{name}: {static} bytes of static shared memory > "
                            f"{dev.gpu.smem_per_block} (dynamic shared memory can opt in to more)")
        problems += [f"{name}: {m}" for m in misaligned_vectors(kern)]
    return problems


def misaligned_vectors(kernel: tirx.PrimFunc) -> List[str]:
    """Vector loads/stores whose first element is not provably a multiple of the vector width:
    TVM's CUDA codegen casts them to float4/half8 pointers without checking, and a misaligned
    vector access faults on the GPU ("misaligned address"), which no compiler here reports."""
    from tvm import sym
    from tvm.ir.expr import TensorLoad

    from tvm_roller.analysis.visit import post_order_visit

    ana = sym.Analyzer()
    bad: List[str] = []
    # the lowered kernel names common subexpressions (cse_v12 = ...): let the analyzer see them
    lets = []
    post_order_visit(kernel.body, lambda n: lets.append(n) if isinstance(
        n, (tirx.LetStmt, tirx.Let)) else None)
    for let in lets:
        ana.bind(let.var, let.value)

    def visit(node):
        if not isinstance(node, (TensorLoad, tirx.BufferStore)):
            return
        idx = node.indices[-1] if node.indices else None
        if not isinstance(idx, tirx.Ramp):
            return
        lanes = int(idx.lanes)
        stride = idx.stride
        if not (isinstance(stride, tirx.IntImm) and int(stride) == 1):
            return  # strided: the codegen gathers element by element
        m = ana.modular_set(idx.base)
        if m.coeff % lanes or m.base % lanes:
            buf = node.buffer if isinstance(node, tirx.BufferStore) else node.source
            bad.append(f"{lanes}-wide access to {getattr(buf, 'name', buf)} at {idx.base} is not "
                       f"provably {lanes}-element aligned")

    post_order_visit(kernel.body, visit)
    return bad


def verify(mod: ModLike, target: TargetLike, dev: Optional[DeviceModel] = None) -> List[str]:
    """Problems of ``mod``'s device kernels on ``dev`` (default: the target's preset): what
    ``verify_gpu_code`` rejects (threads, vector width, shared/local memory), naming the limit,
    and shared memory (static + dynamic) above ``gpu.smem_limit(dev)``. Empty when fine."""
    tgt = _cuda_target(target)
    return _verify_lowered(lower(mod, tgt), dev if dev is not None else gpu.from_target(tgt))


# -- nvcc --------------------------------------------------------------------------------------
def nvcc_path() -> str:
    """``$TVM_ROLLER_NVCC``, else ``nvcc`` on PATH, else /usr/local/cuda/bin/nvcc."""
    cand = os.environ.get("TVM_ROLLER_NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.isfile(cand):
        raise CudaCompileError("nvcc not found (set TVM_ROLLER_NVCC or put nvcc on PATH)")
    return cand


@lru_cache(maxsize=8)
def _nvcc_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    lines = [l for l in out.stdout.splitlines() if l.strip()]
    return lines[-1].strip() if lines else "unknown"


def nvcc_version() -> str:
    return _nvcc_version(nvcc_path())


@lru_cache(maxsize=8)
def _nvcc_codes(path: str) -> Tuple[str, ...]:
    out = subprocess.run([path, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    return tuple(l.strip() for l in out.stdout.splitlines() if l.strip())


def nvcc_supports(arch: str) -> bool:
    """Whether this nvcc generates code for ``arch`` (CUDA 13 dropped sm_50 ... sm_72)."""
    return _norm_arch(arch) in _nvcc_codes(nvcc_path())


def _norm_arch(arch: str) -> str:
    return gpu.ComputeCapability.parse(arch).arch  # "90" / "sm_90" / "compute_90a" -> sm_9x[a]


def _key(kind: str, source: str, arch: str, options: Sequence[str]) -> str:
    h = hashlib.sha256()
    for part in (kind, arch, nvcc_version(), "\0".join(options), source):
        h.update(part.encode("utf-8"))
        h.update(b"\0\0")
    return h.hexdigest()


def _nvcc_dir() -> Path:
    return cache_dir() / "nvcc"


def _run_nvcc(source: str, arch: str, mode: str, options: Sequence[str]) -> Tuple[bytes, str]:
    """Compile ``source`` (mode "cubin" or "ptx") in a private temporary directory; returns the
    output file and nvcc's combined log. Raises CudaCompileError with nvcc's error lines."""
    with tempfile.TemporaryDirectory(prefix="roller-nvcc-") as tmp:
        cu, out = os.path.join(tmp, "k.cu"), os.path.join(tmp, f"k.{mode}")
        with open(cu, "w", encoding="utf-8") as fh:
            fh.write(source)
        # 177 "declared but never referenced": TVM's CSE leaves such variables in every kernel
        cmd = [nvcc_path(), f"-arch={arch}", f"-{mode}", "-diag-suppress", "177",
               *options, "-o", out, cu]
        if mode == "cubin":
            cmd[3:3] = ["-Xptxas", "-v"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired as err:
            raise CudaCompileError(f"nvcc timed out after {err.timeout} s", "") from None
        log = (proc.stdout or "") + (proc.stderr or "")
        if proc.returncode != 0 or not os.path.isfile(out):
            errs = [l.strip() for l in log.splitlines()
                    if re.search(r"\berror\b|fatal", l, re.IGNORECASE)]
            msg = "; ".join(errs[:8]) or log.strip()[-2000:] or f"exit status {proc.returncode}"
            raise CudaCompileError(f"nvcc -arch={arch} failed: {msg}", log, proc.returncode)
        with open(out, "rb") as fh:
            return fh.read(), log


_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_RE_PROPS = re.compile(r"Function properties for (\S+)")
_RE_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_USED = re.compile(r"Used (\d+) registers")
_RE_BARRIERS = re.compile(r"used (\d+) barriers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")
_RE_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_ptxas(log: str) -> Tuple[Dict[str, KernelResources], List[str]]:
    """Per-entry-function resources and the ptxas warnings from an ``nvcc -Xptxas -v`` log.

    ptxas prints, per entry function: "Compiling entry function 'k' for 'sm_90'", "Function
    properties for k", then "N bytes stack frame, N bytes spill stores, N bytes spill loads"
    and "Used N registers, used N barriers, N bytes smem, N bytes cmem[0]" (parts omitted when
    zero). Properties of non-entry (device) functions are skipped."""
    kernels: Dict[str, KernelResources] = {}
    warnings: List[str] = []
    current: Optional[KernelResources] = None
    props_for: Optional[str] = None
    for line in log.splitlines():
        if "ptxas warning" in line:
            warnings.append(line.split(":", 1)[-1].strip())
        m = _RE_ENTRY.search(line)
        if m:
            current = kernels.setdefault(m.group(1), KernelResources(m.group(1)))
            props_for = None
            continue
        m = _RE_PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _RE_STACK.search(line)
        if m and current is not None and props_for == current.name:
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
            continue
        m = _RE_USED.search(line)
        if m and current is not None:
            current.registers = int(m.group(1))
            for rx, attr in ((_RE_BARRIERS, "barriers"), (_RE_SMEM, "smem_static"), (_RE_CMEM, "cmem")):
                mm = rx.search(line)
                if mm:
                    setattr(current, attr, int(mm.group(1)))
    return kernels, warnings


def compile_cubin(source: str, arch: str, options: Sequence[str] = ()) -> PtxasReport:
    """``nvcc -arch=<arch> -cubin -Xptxas -v`` on ``source``; per-kernel ptxas resources.

    Cached under ``cache_dir()/nvcc`` by sha256 of (source, arch, nvcc version, options): the
    report as JSON and the cubin next to it (``cubin_path``). Failures are not cached.
    Raises :class:`CudaCompileError` when nvcc fails."""
    arch = _norm_arch(arch)
    key = _key("cubin", source, arch, options)
    js, cubin = _nvcc_dir() / f"{key}.json", _nvcc_dir() / f"{key}.cubin"
    if js.is_file() and cubin.is_file():
        try:
            rep = PtxasReport.from_json(js.read_text(encoding="utf-8"))
            rep.cubin_path = str(cubin)
            return rep
        except (OSError, ValueError, TypeError, KeyError):
            pass  # unreadable: compile again and overwrite
    data, log = _run_nvcc(source, arch, "cubin", options)
    kernels, warns = parse_ptxas(log)
    rep = PtxasReport(arch, nvcc_version(), kernels, warns)
    atomic_write(cubin, data)  # the cubin first: a JSON file always has its cubin
    atomic_write(js, rep.to_json().encode("utf-8"))
    rep.cubin_path = str(cubin)
    return rep


def compile_ptx(source: str, arch: str, options: Sequence[str] = ()) -> str:
    """``nvcc -ptx`` output (cached like ``compile_cubin``)."""
    arch = _norm_arch(arch)
    path = _nvcc_dir() / f"{_key('ptx', source, arch, options)}.ptx"
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
    data, _ = _run_nvcc(source, arch, "ptx", options)
    atomic_write(path, data)
    return data.decode("utf-8")


def ptx_tensor_core(source: str, arch: str) -> bool:
    """Whether the PTX of ``source`` uses tensor cores (mma.sync, wmma.mma, ldmatrix, wgmma)."""
    return bool(_TENSOR_CORE_PTX.search(compile_ptx(source, arch)))


# -- all together ------------------------------------------------------------------------------
def check(mod: ModLike, target: TargetLike, dev: Optional[DeviceModel] = None) -> CheckReport:
    """Lower, generate, verify and compile ``mod`` for ``target`` (one ``tvm.compile``).

    nvcc failures become a problem in the report rather than an exception, so a caller sees
    every issue at once; launch extraction failures (``UnsupportedError``) leave ``bundle``
    None and are listed too."""
    tgt = _cuda_target(target)
    dev = dev if dev is not None else gpu.from_target(tgt)
    arch = gpu.target_cc(tgt).arch
    lowered, source = _lower_and_source(mod, tgt)
    problems = _verify_lowered(lowered, dev)
    bundle = None
    try:
        bundle = _bundle(lowered, source, arch)
    except UnsupportedError as err:
        problems.append(f"launches: {err}")
    ptxas, tc = None, False
    try:
        ptxas = compile_cubin(source, arch)
        tc = ptx_tensor_core(source, arch)
    except CudaCompileError as err:
        problems.append(str(err))
    return CheckReport(arch, source, problems, ptxas, tc, bundle)


_STATIC_SMEM_BYTES = 48 * 1024  # static __shared__ per block, every CUDA architecture
_MAX_BLOCK_THREADS = 1024
_RE_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\((\d+)\)")


def _cuda_sources(module) -> List[str]:
    """The CUDA source of every device module under ``module`` (imports, recursively)."""
    out = []
    for sub in module.imports:
        if sub.kind == "cuda":
            out.append(sub.inspect_source())
        out += _cuda_sources(sub)
    return out


def check_executable(ex, target: TargetLike, dev: Optional[DeviceModel] = None) -> List[PtxasReport]:
    """nvcc + ``ptxas -v`` on every CUDA kernel of a built module (what ``tvm_roller.build`` or
    ``tvm.compile`` returned), against the device's limits: raises :class:`CudaCompileError`
    when nvcc rejects a kernel or a kernel declares more threads per block or static shared
    memory than ``dev`` (default: the target's preset) allows."""
    tgt = _cuda_target(target)
    if dev is None:
        try:
            dev = gpu.from_target(tgt)
        except UnsupportedError:
            dev = None  # an arch with no preset: the limits every CUDA GPU has
    smem_cap = dev.gpu.smem_per_block if dev is not None else _STATIC_SMEM_BYTES
    thread_cap = dev.gpu.max_threads_per_block if dev is not None else _MAX_BLOCK_THREADS
    arch = gpu.target_cc(tgt).arch
    module = getattr(ex, "mod", ex)
    reports = []
    for source in _cuda_sources(module):
        rep = compile_cubin(source, arch)
        over = [f"{name}: {k.smem_static} B static shared memory > {smem_cap}"
                for name, k in rep.kernels.items() if k.smem_static > smem_cap]
        over += [f"__launch_bounds__({n}) > {thread_cap} threads per block"
                 for n in map(int, _RE_LAUNCH_BOUNDS.findall(source)) if n > thread_cap]
        if over:
            raise CudaCompileError("CUDA kernel over the device's limits: " + "; ".join(over))
        reports.append(rep)
    return reports


__all__ = [
    "CudaCompileError", "ParamSpec", "Workspace", "KernelArg", "KernelLaunch", "KernelBundle",
    "KernelResources", "PtxasReport", "CheckReport", "lower", "kernel_launches", "verify",
    "device_kernels", "misaligned_vectors", "compile_cubin", "compile_ptx", "ptx_tensor_core", "parse_ptxas", "check",
    "nvcc_path", "nvcc_version", "nvcc_supports", "check_executable",
]
