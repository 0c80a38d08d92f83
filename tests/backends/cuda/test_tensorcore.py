"""Tensor-core lowering of fp16 matmuls (``backends.cuda.tensorcore*``), checked without a GPU.

* fast (~20 s): workloads, GEMM structure, refused tiles, shared memory accounting against the
  lowered kernel, ``verify_gpu_code``, trace replay, and the generated CUDA of nine variants
  (wmma and ldmatrix + mma.sync; batch; B transposed with a bias + relu epilogue; A transposed
  with an fp32 output; transposing and casting producers; 1-3 pipeline stages) run on the host
  by an emulator and compared with numpy; plus a check that the emulator catches broken kernels;
* slow (``-m slow``, ~35 s): nvcc (sm_90 and sm_80) on the three ``FP16_GEMMS`` and a batched
  GEMM with both tensor-core flavours: no spills, no stack frame, shared memory as computed and
  within the H100 preset, ``verify_gpu_code`` on the lowered kernel, (wmma.)mma.sync (and
  ldmatrix) and cp.async in the PTX.

The emulator is ``cuda_emulator.emulate`` (TVM's CUDA source run as host C++, one OS thread per
CUDA thread).
"""
from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_roller import hardware
from tvm_roller.backends.registry import backend_for
from tvm_roller.hardware import normalize_target
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware import gpu
from tvm_roller.backends.cuda import tensorcore as tc
from tvm_roller.backends.cuda import tensorcore_gemm as tcg
from tvm_roller.backends.cuda import tensorcore_intrinsics as tci
from tvm_roller.backends.cuda import tensorcore_pipeline as tcp
from tvm_roller.core.rtile import RTile
from tvm_roller.tools.suite import gpu_workloads as gw

from conftest import CUDA_TARGETS
from cuda_emulator import NVCC, emulate, needs_emulator

CUDA = backend_for(normalize_target("cuda"))

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")

TARGETS = CUDA_TARGETS


def target(arch):
    return tvm.target.Target(TARGETS[arch])


def make_tile(fa, l1, reg, stages=2, shape=tcg.WMMA):
    """A CUDA RTile for ``fa``'s axes: ``l1`` the block tile, ``reg`` the warp tile."""
    bm_bn_warps = 1
    for i, a in enumerate(fa.axes):
        if a.kind == "S" and reg[i] > 1:
            bm_bn_warps *= l1[i] // reg[i]
    return RTile(kind="tiled", axes=[a.name for a in fa.axes], extents=[a.extent for a in fa.axes],
                 axis_kinds="".join(a.kind for a in fa.axes), reg=list(reg), l1=list(l1),
                 l2=list(l1), vector_axis=None, vector_lanes=8, backend="cuda",
                 threads=32 * bm_bn_warps, stages=stages, tensor_core=shape)


# -- more workloads: layouts and epilogues --------------------------------------------------------
def gemm_nt_bias_relu(M, N, K):
    """relu(A[M, K] @ W[N, K]^T + bias[N]) in fp16 (nn.Linear's layout)."""
    A = te.placeholder((M, K), "float16", name="A")
    W = te.placeholder((N, K), "float16", name="W")
    bias = te.placeholder((N,), "float16", name="bias")
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute((M, N), lambda i, j: te.sum(
        A[i, k].astype("float32") * W[j, k].astype("float32"), axis=k), name="matmul")
    add = te.compute((M, N), lambda i, j: acc[i, j] + bias[j].astype("float32"), name="add")
    out = te.compute((M, N), lambda i, j: te.max(add[i, j], tvm.tirx.const(0, "float32"))
                     .astype("float16"), name="relu")
    return te.create_prim_func([A, W, bias, out]).with_attr("global_symbol", "main")


def gemm_tn_f32(M, N, K):
    """A[K, M]^T @ B[K, N] with a float32 output (no epilogue)."""
    A = te.placeholder((K, M), "float16", name="A")
    B = te.placeholder((K, N), "float16", name="B")
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute((M, N), lambda i, j: te.sum(
        A[k, i].astype("float32") * B[k, j].astype("float32"), axis=k), name="matmul")
    return te.create_prim_func([A, B, acc]).with_attr("global_symbol", "main")


def _matmul_to_f16(a, b, M, N, K, params):
    """C = float16(sum_k float32(a[i, k]) * float32(b[k, j])) as a PrimFunc of ``params``."""
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute((M, N), lambda i, j: te.sum(
        a[i, k].astype("float32") * b[k, j].astype("float32"), axis=k), name="matmul")
    C = te.compute((M, N), lambda i, j: acc[i, j].astype("float16"), name="C")
    return te.create_prim_func(list(params) + [C]).with_attr("global_symbol", "main")


def gemm_transposed_producer(M, N, K):
    """A[M, K] @ BT with BT[k, n] = W[n, k] a block of its own: inlined, the B copy gathers."""
    A = te.placeholder((M, K), "float16", name="A")
    W = te.placeholder((N, K), "float16", name="W")
    BT = te.compute((K, N), lambda k, n: W[n, k], name="BT")
    return _matmul_to_f16(A, BT, M, N, K, [A, W])


def gemm_cast_producer(M, N, K):
    """float16(A32[M, K]) @ B[K, N]: a cast producer, inlined into the A copy (float4 loads)."""
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float16", name="B")
    Ah = te.compute((M, K), lambda i, k: A[i, k].astype("float16"), name="Ah")
    return _matmul_to_f16(Ah, B, M, N, K, [A, B])


def gemm_f16_acc(M, N, K):
    A = te.placeholder((M, K), "float16", name="A")
    B = te.placeholder((K, N), "float16", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return te.create_prim_func([A, B, C]).with_attr("global_symbol", "main")


def _reference(name, arrays):
    f = {k: v.astype(np.float64) for k, v in arrays.items()}
    if name == "nt_bias_relu":
        return np.maximum(f["A"] @ f["W"].T + f["bias"], 0)
    if name == "tn":
        return f["A"].T @ f["B"]
    if name == "transposed_producer":
        return f["A"] @ f["W"].T
    if name == "cast_producer":
        return arrays["A"].astype(np.float16).astype(np.float64) @ f["B"]
    return np.matmul(f["A"], f["B"])


# -- workloads and structure ----------------------------------------------------------------------
def test_fp16_workloads():
    assert set(gw.FP16_GEMMS) == {"HGEMM:4096", "HGEMM:1024", "HGEMM:128x3072x768"}
    for name, (M, N, K) in gw.FP16_GEMMS.items():
        fa = CUDA.analyze(gw.create(name))
        assert fa.main == "matmul" and fa.consumers == ["C"]
        assert [(a.extent, a.kind) for a in fa.axes] == [(M, "S"), (N, "S"), (K, "R")]
    func = gw.create("BHGEMM:3x64x32x16")
    shapes = [tuple(int(d) for d in p.ty.shape) for p in func.params]
    assert shapes == [(3, 64, 16), (3, 16, 32), (3, 64, 32)]
    assert [str(p.dtype) for p in func.params] == ["float16"] * 3
    with pytest.raises(ValueError, match="unknown fp16 GEMM"):
        gw.create("GEMM:12")


@pytest.mark.parametrize("func, expect", [
    (lambda: gw.fp16_gemm(64, 64, 64), ([], False, False)),
    (lambda: gw.fp16_batch_gemm(2, 64, 64, 64), ([0], False, False)),
    (lambda: gemm_nt_bias_relu(64, 64, 64), ([], False, True)),
    (lambda: gemm_tn_f32(64, 64, 64), ([], True, False)),
])
def test_gemm_structure(func, expect):
    g = tcg.gemm_structure(CUDA.analyze(func()))
    assert (g.batch, g.trans_a, g.trans_b) == expect


# -- tiles the lowering refuses -------------------------------------------------------------------
H100 = hardware.preset("h100")


@pytest.mark.parametrize("case, func, l1, reg, kw, match", [
    # an odd shape is padded (tests/backends/cuda/test_tensorcore_padding.py), within limits
    ("block past the extent", lambda: gw.fp16_gemm(100, 128, 128), [128, 128, 32],
     [64, 64, 16], {}, "larger than"),
    ("warp tile", lambda: gw.fp16_gemm(128, 128, 128), [120, 128, 32], [40, 64, 16], {},
     "not a multiple of 16"),
    ("K chunk", lambda: gw.fp16_gemm(128, 128, 128), [128, 128, 24], [64, 64, 16], {},
     "K chunk 24"),
    ("threads", lambda: gw.fp16_gemm(128, 128, 128), [128, 128, 32], [64, 64, 16],
     {"threads": 256}, "4 warps = 128 threads"),
    ("accumulators", lambda: gw.fp16_gemm(256, 256, 64), [256, 128, 32], [128, 64, 16], {},
     "at most 128"),
    ("vector loads", lambda: gw.fp16_gemm(256, 256, 64), [128, 128, 16], [32, 32, 16], {},
     "whole multiples"),
    ("fp16 accumulation", lambda: gemm_f16_acc(128, 128, 128), [128, 128, 32], [64, 64, 16], {},
     "float32 accumulation"),
    ("shape name", lambda: gw.fp16_gemm(128, 128, 128), [128, 128, 32], [64, 64, 16],
     {"tensor_core": "wgmma"}, "unknown fragment shape"),
    ("mma with A transposed", lambda: gemm_tn_f32(128, 128, 128), [128, 128, 32], [64, 64, 16],
     {"tensor_core": tcg.MMA}, "A stored"),
])
def test_refused(case, func, l1, reg, kw, match):
    f = func()
    fa = CUDA.analyze(f)
    tile = make_tile(fa, l1, reg)
    for k, v in kw.items():
        setattr(tile, k, v)
    with pytest.raises(UnsupportedError, match=match):
        tc.apply_tensorcore(f, fa, tile)
    with pytest.raises(UnsupportedError, match=match):
        tcg.validate_tile(fa, tile, H100)


def test_not_a_matmul_refused():
    X = te.placeholder((64, 64), "float16", name="X")
    k = te.reduce_axis((0, 64), name="k")
    S = te.compute((64,), lambda i: te.sum(X[i, k].astype("float32"), axis=k), name="S")
    fa = CUDA.analyze(te.create_prim_func([X, S]))
    with pytest.raises(UnsupportedError, match="tensor cores"):
        tcg.gemm_structure(fa)


def test_validate_tile_device_limits():
    f = gw.fp16_gemm(4096, 4096, 4096)
    fa = CUDA.analyze(f)
    ok = make_tile(fa, [128, 128, 32], [64, 64, 16], stages=3, shape=tcg.MMA)
    tcg.validate_tile(fa, ok, H100)
    tcg.validate_tile(fa, ok, hardware.preset("a100"))
    v100 = hardware.preset("v100")
    with pytest.raises(UnsupportedError, match="sm_80"):
        tcg.validate_tile(fa, ok, v100)  # mma.sync m16n8k16
    ok.tensor_core = tcg.WMMA
    with pytest.raises(UnsupportedError, match="cp.async"):
        tcg.validate_tile(fa, ok, v100)
    ok.stages = 1
    tcg.validate_tile(fa, ok, v100)  # wmma without a pipeline runs on sm_70
    big = make_tile(fa, [256, 256, 64], [64, 64, 16], stages=4)  # 16 warps, 4 stages
    assert tcg.smem_bytes(fa, big) > gpu.smem_limit(H100)
    with pytest.raises(UnsupportedError, match="shared memory"):
        tcg.validate_tile(fa, big, H100)
    with pytest.raises(UnsupportedError, match="not a GPU"):
        tcg.validate_tile(fa, ok, hardware.preset("x86-avx512"))


def test_smem_bytes_formula():
    fa = CUDA.analyze(gw.fp16_gemm(4096, 4096, 4096))
    t = make_tile(fa, [128, 128, 32], [64, 64, 16], stages=2)
    ab = 2 * (128 * (32 + 8) + 32 * (128 + 8)) * 2
    assert tcg.smem_bytes(fa, t) == max(ab, 128 * (128 + 4) * 4) == 67584
    t = make_tile(fa, [128, 256, 32], [64, 64, 16], stages=4)
    ab = 4 * (128 * (32 + 8) + 32 * (256 + 8)) * 2
    assert tcg.smem_bytes(fa, t) == max(ab, 128 * (256 + 4) * 4)


@pytest.mark.parametrize("shape, stages", [(tcg.WMMA, 2), (tcg.MMA, 3)])
def test_smem_bytes_matches_lowered_kernel(shape, stages):
    from tvm.s_tir.analysis import calculate_allocated_bytes, verify_gpu_code

    f = gw.fp16_gemm(512, 512, 256)
    fa = CUDA.analyze(f)
    tile = make_tile(fa, [128, 128, 32], [64, 64, 16], stages=stages, shape=shape)
    sch = tc.apply_tensorcore(f, fa, tile)
    kern = tcp.lower_device_kernel(sch.mod, tile, target("sm_90"))
    used = calculate_allocated_bytes(kern)
    used = dict(used[list(used.keys())[0]])
    assert used.get("shared.dyn") == tcg.smem_bytes(fa, tile)
    assert "shared" not in used  # everything in the one dynamic allocation
    assert verify_gpu_code(kern, gpu.verify_constraints(H100))


def test_trace_replays():
    f = gemm_nt_bias_relu(256, 256, 128)
    fa = CUDA.analyze(f)
    for shape in (tcg.WMMA, tcg.MMA):
        sch = tc.apply_tensorcore(f, fa, make_tile(fa, [128, 128, 32], [64, 64, 16], shape=shape))
        fresh = tvm.s_tir.Schedule(f)
        sch.trace.apply_to_schedule(fresh, remove_postproc=False)
        tvm.ir.assert_structural_equal(fresh.mod, sch.mod)


def test_intrinsics_registered_once_with_roller_names():
    from tvm.s_tir import TensorIntrin

    for _ in range(2):
        names = list(tci.wmma_intrinsics(False, True).values())
        names += list(tci.mma_intrinsics(False).values())
    assert all(n.startswith("roller_") for n in names)
    assert all(TensorIntrin.get(n) is not None for n in names)


# -- numerics: the generated CUDA on the host emulator ----------------------------------------
EMU_CASES = {
    # name: (workload, shape, l1, reg, stages, flavour)
    "wmma": ("nn", (256, 256, 128), [128, 128, 32], [64, 64, 16], 2, tcg.WMMA),
    "mma": ("nn", (256, 256, 128), [128, 128, 32], [64, 64, 16], 2, tcg.MMA),
    "wmma-batch-3stage": ("batch", (2, 64, 128, 128), [1, 64, 64, 32], [1, 32, 32, 16], 3,
                          tcg.WMMA),
    "mma-batch-1stage": ("batch", (2, 64, 128, 64), [1, 64, 64, 32], [1, 32, 32, 16], 1, tcg.MMA),
    "wmma-nt-bias-relu": ("nt_bias_relu", (128, 128, 128), [64, 128, 32], [32, 64, 16], 2,
                          tcg.WMMA),
    "mma-nt-bias-relu-3stage": ("nt_bias_relu", (128, 128, 128), [64, 128, 32], [32, 64, 16], 3,
                                tcg.MMA),
    "wmma-tn-f32": ("tn", (128, 128, 64), [64, 64, 32], [32, 32, 16], 2, tcg.WMMA),
    "mma-transposed-producer": ("transposed_producer", (128, 128, 64), [64, 64, 32],
                                [32, 32, 16], 2, tcg.MMA),
    "wmma-cast-producer": ("cast_producer", (128, 128, 64), [64, 64, 32], [32, 32, 16], 2,
                           tcg.WMMA),
}
FAST_EMU = tuple(EMU_CASES)  # ~1-2 s each


def _emu_case(name):
    kind, shape, l1, reg, stages, flavour = EMU_CASES[name]
    if kind == "nn":
        f = gw.fp16_gemm(*shape)
    elif kind == "batch":
        f = gw.fp16_batch_gemm(*shape)
    else:
        f = {"nt_bias_relu": gemm_nt_bias_relu, "tn": gemm_tn_f32,
             "transposed_producer": gemm_transposed_producer,
             "cast_producer": gemm_cast_producer}[kind](*shape)
    return kind, f, l1, reg, stages, flavour


@needs_emulator
@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in FAST_EMU else [pytest.mark.slow])
                                  for n in EMU_CASES])
def test_emulated_numerics(name, tmp_path):
    from tvm.s_tir.analysis import verify_gpu_code

    from tvm_roller.analysis import unwrap_func

    kind, f, l1, reg, stages, flavour = _emu_case(name)
    fa = CUDA.analyze(f)
    tile = make_tile(fa, l1, reg, stages=stages, shape=flavour)
    sch = tc.apply_tensorcore(f, fa, tile)
    src = tcp.build(sch.mod, tile, target("sm_80")).mod.imports[0].inspect_source()
    # a gathering copy (the transposed producer) must not become cp.async
    assert ("cp.async" in src) == (stages >= 2 and kind != "transposed_producer")
    assert verify_gpu_code(tcp.lower_device_kernel(sch.mod, tile, target("sm_80")),
                           gpu.verify_constraints(hardware.preset("a100")))
    rng = np.random.default_rng(0)
    params = [p for p in unwrap_func(f).params]
    arrays = {}
    for p in params[:-1]:
        shape = tuple(int(d) for d in p.ty.shape)
        arrays[p.name] = rng.uniform(-1, 1, shape).astype(str(p.dtype))
    out = params[-1]
    out_shape = tuple(int(d) for d in out.ty.shape)
    arrays[out.name] = np.full(out_shape, np.nan, str(out.dtype))
    # grid and block from the tile: blockIdx.x over N, .y over M, .z over the batch
    g = tcg.gemm_structure(fa)
    ext = [a.extent for a in fa.axes]
    grid = (ext[g.n] // l1[g.n], ext[g.m] // l1[g.m], int(np.prod([ext[b] for b in g.batch])))
    block = (32, tile.threads // 32, 1)
    got = emulate(src, grid, block, tcg.smem_bytes(fa, tile), arrays, out.name,
                   workdir=str(tmp_path))
    ref = _reference(kind, arrays)
    assert np.all(np.isfinite(got)), "elements never written (NaN)"
    err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
    tol = 2e-3 if str(out.dtype) == "float16" else 1e-5
    assert err < tol, f"relative max error {err:.3g}"


# -- nvcc on the FP16_GEMMS ---------------------------------------------------------------------
# (M, N, K) -> block tile, warp tile, stages; 128 x 3072 x 768 gets smaller blocks (96 of them)
NVCC_TILES = {
    "HGEMM:4096": ([128, 128, 32], [64, 64, 16], 3),
    "HGEMM:1024": ([128, 128, 32], [64, 64, 16], 2),
    "HGEMM:128x3072x768": ([64, 64, 32], [32, 32, 16], 3),
    "BHGEMM:8x512x512x512": ([1, 128, 128, 32], [1, 64, 64, 16], 2),
}


def nvcc_report(src, arch, workdir):
    """ptxas -v of ``src`` as a cubin, and its PTX: (registers, stack, spill stores, smem, ptx)."""
    cu = os.path.join(workdir, f"k_{arch}.cu")
    with open(cu, "w") as fh:
        fh.write(src)
    r = subprocess.run([NVCC, f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", cu + ".cubin", cu],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    p = subprocess.run([NVCC, f"-arch={arch}", "-ptx", "-o", cu + ".ptx", cu], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(cu + ".ptx") as fh:
        ptx = fh.read()
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    stack, spill = map(int, re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores",
                                      log).groups())
    return regs, stack, spill, ptx


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("flavour", [tcg.WMMA, tcg.MMA])
@pytest.mark.parametrize("name", list(NVCC_TILES))
def test_nvcc_fp16_gemm(name, flavour, tmp_path):
    from tvm.s_tir.analysis import calculate_allocated_bytes, verify_gpu_code

    f = gw.create(name)
    fa = CUDA.analyze(f)
    l1, reg, stages = NVCC_TILES[name]
    tile = make_tile(fa, l1, reg, stages=stages, shape=flavour)
    for arch, preset in (("sm_90", "h100"), ("sm_80", "a100")):
        dev = hardware.preset(preset)
        tcg.validate_tile(fa, tile, dev)
        sch = tc.apply_tensorcore(f, fa, tile)
        tgt = target(arch)
        kern = tcp.lower_device_kernel(sch.mod, tile, tgt)
        assert verify_gpu_code(kern, gpu.verify_constraints(dev))
        used = calculate_allocated_bytes(kern)
        smem = dict(used[list(used.keys())[0]])["shared.dyn"]
        assert smem == tcg.smem_bytes(fa, tile) <= gpu.smem_limit(hardware.preset("h100"))
        src = tcp.build(sch.mod, tile, tgt).mod.imports[0].inspect_source()
        regs, stack, spill, ptx = nvcc_report(src, arch, str(tmp_path))
        assert spill == 0 and stack == 0, f"{arch}: {stack} B stack frame, {spill} B spill stores"
        assert regs <= 255
        assert re.search(r"\bwmma\.mma\.sync\b" if flavour == tcg.WMMA else r"\bmma\.sync\.aligned"
                         r"\.m16n8k16\b", ptx)
        if flavour == tcg.MMA:
            assert "ldmatrix.sync.aligned" in ptx
        assert ("cp.async" in ptx) == (stages >= 2)
        print(f"{name} {flavour} {arch}: {regs} registers, {smem} B smem, {stack} B stack, "
              f"{spill} B spill stores")


@needs_emulator
def test_emulator_catches_broken_kernels(tmp_path):
    """The emulator is not vacuous: a cp.async wait that covers too little, a dropped barrier and
    an ldmatrix without its transpose each give wrong results (or an emulator failure)."""
    M, N, K = 128, 128, 128
    f = gw.fp16_gemm(M, N, K)
    fa = CUDA.analyze(f)
    tile = make_tile(fa, [64, 64, 32], [32, 32, 16], stages=2, shape=tcg.MMA)
    src = tcp.build(tc.apply_tensorcore(f, fa, tile).mod, tile,
                   target("sm_80")).mod.imports[0].inspect_source()
    rng = np.random.default_rng(1)
    arrays = {"A": rng.uniform(-1, 1, (M, K)).astype("float16"),
              "B": rng.uniform(-1, 1, (K, N)).astype("float16")}
    ref = arrays["A"].astype(np.float64) @ arrays["B"].astype(np.float64)
    mutations = {
        "none": lambda s: s,
        "wait_group 1 -> 2": lambda s: s.replace('"cp.async.wait_group 1;"',
                                                 '"cp.async.wait_group 2;"'),
        "no __syncthreads": lambda s: s.replace("__syncthreads();", ""),
        "ldmatrix without .trans": lambda s: s.replace("m8n8.x4.trans.shared", "m8n8.x4.shared"),
    }
    for i, (name, mutate) in enumerate(mutations.items()):
        mutated = mutate(src)
        assert name == "none" or mutated != src, name
        args = dict(arrays, C=np.full((M, N), np.nan, "float16"))
        try:
            got = emulate(mutated, (N // 64, M // 64, 1), (32, 4, 1), tcg.smem_bytes(fa, tile),
                           args, "C", workdir=str(tmp_path / str(i)))
            err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
            ok = bool(np.isfinite(err) and err < 2e-3)
        except RuntimeError:
            ok = False
        assert ok == (name == "none"), name
