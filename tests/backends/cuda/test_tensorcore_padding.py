"""Padded tensor-core kernels: M, N and K that the block tile (K chunk) does not divide.

``tensorcore_gemm.padded_extents`` is the padding a tile implies (``padding_notes`` explains it),
``validate_tile`` keeps the tile within the extents, and ``apply_tensorcore`` pads the main block
(``pad_einsum``: zero-filled operand tiles, a predicated epilogue store). Checked without a GPU:

* fast: the declaration and its checks, the copy / store vector widths, the generated CUDA of
  padded kernels (odd and prime shapes, wmma and ldmatrix + mma.sync, batch, B or A
  transposed, a bias + relu epilogue, an fp32 output, a casting producer, scalar and predicated
  cp.async copies) run on the host emulator against a float64 numpy reference on random data,
  with a guard after the output that an unpredicated store would overwrite; planned kernels of
  small odd shapes the same way; nvcc on a few planned kernels;
* slow (``-m slow``, ~2.5 min): 48 seeded random fp16 matmuls (extents 16..1024, a third prime
  or odd, some batched, some with B transposed, epilogues): at least 90% plan tensor cores and
  compile with nvcc (tensor-core PTX, no problems).
"""
from __future__ import annotations

import random
import re

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_roller
from tvm_roller import hardware
from tvm_roller.analysis import unwrap_func
from tvm_roller.planner import Context, plan, plan_prepared, prepare
from tvm_roller.backends.cuda import tensorcore as tc
from tvm_roller.backends.cuda import tensorcore_gemm as tcg
from tvm_roller.backends.cuda import tensorcore_pipeline as tcp
from tvm_roller.backends.registry import backend_for
from tvm_roller.hardware import normalize_target
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile

from cuda_emulator import NVCC, emulate, needs_emulator

CUDA = backend_for(normalize_target("cuda"))
H100 = hardware.preset("h100")
H100_TARGET = "nvidia/nvidia-h100"
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


# -- workloads -----------------------------------------------------------------------------------
def gemm(batch, M, N, K, trans_b=False, epi="cast", trans_a=False, cast_producer=False):
    """(batched) fp16 matmul, fp32 accumulation; ``epi``: "cast" (fp16 out), "f32" (the
    accumulator is the output) or "bias_relu" (fp16 relu(acc + bias[N]))."""
    bs = (batch,) if batch else ()
    a_shape = bs + ((K, M) if trans_a else (M, K))
    if cast_producer:
        A32 = te.placeholder(a_shape, "float32", name="A")
        A = te.compute(a_shape, lambda *i: A32[i].astype("float16"), name="Ah")
        params = [A32]
    else:
        A = te.placeholder(a_shape, "float16", name="A")
        params = [A]
    B = te.placeholder(bs + ((N, K) if trans_b else (K, N)), "float16", name="B")
    params.append(B)
    k = te.reduce_axis((0, K), name="k")

    def body(*idx):
        b, i, j = idx[:-2], idx[-2], idx[-1]
        a = A[b + (k, i)] if trans_a else A[b + (i, k)]
        bv = B[b + (j, k)] if trans_b else B[b + (k, j)]
        return te.sum(a.astype("float32") * bv.astype("float32"), axis=k)

    acc = te.compute(bs + (M, N), body, name="matmul")
    if epi == "f32":
        out = acc
    elif epi == "cast":
        out = te.compute(bs + (M, N), lambda *i: acc[i].astype("float16"), name="C")
    else:
        bias = te.placeholder((N,), "float16", name="bias")
        params.append(bias)
        add = te.compute(bs + (M, N), lambda *i: acc[i] + bias[i[-1]].astype("float32"),
                         name="add")
        out = te.compute(bs + (M, N), lambda *i: te.max(add[i], tvm.tirx.const(0, "float32"))
                         .astype("float16"), name="relu")
    return te.create_prim_func(params + [out]).with_attr("global_symbol", "main")


def reference(arrays, trans_a, trans_b, epi, cast_producer=False):
    a = arrays["A"].astype(np.float16) if cast_producer else arrays["A"]
    a, b = a.astype(np.float64), arrays["B"].astype(np.float64)
    if trans_a:
        a = np.swapaxes(a, -1, -2)
    if trans_b:
        b = np.swapaxes(b, -1, -2)
    acc = a @ b
    if epi == "bias_relu":
        acc = np.maximum(acc + arrays["bias"].astype(np.float64), 0)
    return acc


def make_tile(fa, l1, reg, stages=2, shape=tcg.WMMA):
    """A tensor-core RTile (``l1`` block tile, ``reg`` warp tile)."""
    warps = 1
    for i, a in enumerate(fa.axes):
        if a.kind == "S" and reg[i] > 1:
            warps *= l1[i] // reg[i]
    t = RTile(kind="tiled", axes=[a.name for a in fa.axes], extents=[a.extent for a in fa.axes],
              axis_kinds="".join(a.kind for a in fa.axes), reg=list(reg), l1=list(l1),
              l2=list(l1), vector_axis=None, vector_lanes=8, backend="cuda", threads=32 * warps,
              stages=stages, tensor_core=shape)
    return t


def random_inputs(func, seed=0):
    """Random inputs (not zeros: padding must not be what makes the result right) and a NaN
    output, for the emulator."""
    rng = np.random.default_rng(seed)
    params = list(unwrap_func(func).params)
    arrays = {}
    for p in params[:-1]:
        shape = tuple(int(d) for d in p.ty.shape)
        arrays[p.name] = rng.uniform(-1, 1, shape).astype(str(p.dtype))
    out = params[-1]
    return arrays, out.name, tuple(int(d) for d in out.ty.shape), str(out.dtype)


# -- the emulator, with predicated cp.async and a guard after the output -----------------------
_HELPER = re.compile(r"__forceinline__ __device__ void (\w+)\(([^)]*)\) \{\n(.*?)\n\}\n", re.S)


def _predicated_cp_async(src, zero_fill=True):
    """TVM's predicated cp.async helper (``@p cp.async`` / ``@!p st.shared`` of zeros) as host
    code over the emulator's cp.async queue: in bounds, a deferred copy (done at the covering
    wait_group); out of bounds, the zero store at once, as ``st.shared`` does. (The emulator
    itself refuses predicated cp.async.)"""
    def fn(m):
        name, params, body = m.groups()
        if "@p cp.async" not in body:
            return m.group(0)
        n = int(re.search(r'"n"\((\d+)\)', body).group(1))
        zeros = 4 * len(re.search(r"@!p st\.shared[.\w]* \[%0\], \{([^}]*)\}", body)
                        .group(1).split(","))
        pred = params.split(",")[-1].split()[-1]
        keep = "\n".join(line for line in body.splitlines()
                         if "dst_p =" in line or "src_p =" in line)
        fill = f"memset(dst_p, 0, {zeros});" if zero_fill else ""
        return (f"static inline void {name}({params}) {{\n{keep}\n"
                f"  if ({pred}) emu_cp_async(dst_p, src_p, {n});\n"
                f"  else {{ emu_cvta_shared(dst_p + {zeros} - 1); {fill} }}\n"
                "}\n")

    return _HELPER.sub(fn, src)


GUARD = 4096  # elements after the output: a store past its end shows as a changed guard


def run_emulated(src, grid, block, smem, arrays, out_name, out_shape, out_dtype, workdir,
                 zero_fill=True):
    args = dict(arrays)
    size = int(np.prod(out_shape))
    args[out_name] = np.full(size + GUARD, np.nan, out_dtype)
    got = emulate(_predicated_cp_async(src, zero_fill), grid, block, smem, args, out_name,
                  workdir=workdir)
    assert np.all(np.isnan(got[size:])), "stores past the end of the output (unpredicated)"
    got = got[:size].reshape(out_shape)
    assert np.all(np.isfinite(got)), "output elements never written (NaN)"
    return got


def _grid(fa, tile):
    g = tcg.gemm_structure(fa)
    ext = [a.extent for a in fa.axes]
    batch = int(np.prod([ext[b] for b in g.batch])) if g.batch else 1
    return (-(-ext[g.n] // tile.l1[g.n]), -(-ext[g.m] // tile.l1[g.m]), batch)


def check_numerics(func, fa, tile, sch, ref_of, workdir, arch_target="nvidia/nvidia-a100"):
    src = tcp.build(sch.mod, tile, tvm.target.Target(arch_target)).mod.imports[0] \
        .inspect_source()
    arrays, out_name, out_shape, out_dtype = random_inputs(func)
    got = run_emulated(src, _grid(fa, tile), (32, tile.threads // 32, 1), tcg.smem_bytes(fa, tile),
                       arrays, out_name, out_shape, out_dtype, workdir)
    ref = ref_of(arrays)
    err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
    assert err < (2e-3 if out_dtype == "float16" else 1e-5), f"relative max error {err:.3g}"
    return src


# -- the padding ---------------------------------------------------------------------------------
def test_padding_follows_from_the_tile():
    fa = CUDA.analyze(gemm(0, 197, 211, 97))
    t = make_tile(fa, [64, 64, 32], [32, 32, 16])
    tcg.validate_tile(fa, t, H100)
    assert tcg.padded_extents(fa, t) == {0: 256, 1: 256, 2: 128}
    assert tcg.padding_notes(fa, t) == [
        "tensor cores: M (axis v_i0) padded 197 -> 256 (waste 23.0%)",
        "tensor cores: N (axis v_i1) padded 211 -> 256 (waste 17.6%)",
        "tensor cores: K (axis v_k) padded 97 -> 128 (waste 24.2%)"]
    # through JSON (schedule caches) the tile stays valid; a smaller K chunk pads less
    tcg.validate_tile(fa, RTile.from_json(t.to_json()), H100)
    t.l1[2] = t.l2[2] = 16
    assert tcg.padded_extents(fa, t)[2] == 112
    aligned = CUDA.analyze(gemm(0, 128, 128, 64))
    t2 = make_tile(aligned, [64, 64, 32], [32, 32, 16])
    assert tcg.padded_extents(aligned, t2) == {} and tcg.padding_notes(aligned, t2) == []


def test_padding_must_stay_below_half_the_work():
    fa = CUDA.analyze(gemm(0, 17, 40, 23))
    t = make_tile(fa, [32, 32, 16], [16, 16, 16])  # a 32-row block for 17 rows
    with pytest.raises(UnsupportedError, match="larger than v_i0 = 17"):
        tcg.validate_tile(fa, t, H100)


def test_copy_and_store_vectors():
    assert [tcg.copy_lanes(r) for r in (16, 40, 36, 34, 23, 1024)] == [8, 8, 4, 2, 1, 8]
    assert [tcg.store_lanes(n) for n in (16, 36, 34, 23)] == [4, 4, 2, 1]
    # odd rows: scalar copies; the tile must then be whole multiples of the threads
    fa = CUDA.analyze(gemm(0, 64, 63, 23))
    tcg.validate_tile(fa, make_tile(fa, [32, 32, 16], [16, 16, 16]), H100)


def test_planned_padding_is_explained_and_survives_the_cache():
    """A planned padded tile says so in its notes, and read back (a schedule-cache hit) it goes
    through the rule's validation unchanged."""
    func = gemm(0, 45, 29, 56)
    t = plan(func, H100_TARGET).tiles[0]
    assert t.tensor_core and any("padded" in n for n in t.notes)
    again = plan_prepared(prepare(func, Context.make(H100_TARGET)),
                          tiles=[RTile.from_json(t.to_json())])
    assert again.tiles[0] == t


# -- numerics on the emulator --------------------------------------------------------------------
# name: (batch, M, N, K, trans_b, epi, l1 (M, N, K), warp tile (M, N), stages, flavour, extra)
EMU_CASES = {
    # odd rows everywhere: scalar guarded copies, no cp.async, 1 warp
    "wmma-17x19x23": (0, 17, 19, 23, False, "cast", (16, 16, 16), (16, 16), 2, tcg.WMMA, {}),
    "mma-17x19x23-3stage": (0, 17, 19, 23, False, "cast", (16, 16, 16), (16, 16), 3, tcg.MMA, {}),
    # batch 3, rows of 40 and 24 halves: 16-byte predicated cp.async, M, N and K padded
    "wmma-batch3": (3, 33, 24, 40, False, "cast", (32, 16, 32), (16, 16), 2, tcg.WMMA, {}),
    # B[N, K] with K padded inside a row of 40: each 8-half vector wholly in or out of bounds
    "wmma-nt-bias-relu": (0, 37, 40, 40, True, "bias_relu", (32, 32, 32), (16, 16), 2, tcg.WMMA,
                          {}),
    "mma-nt-f32-odd-n": (0, 45, 29, 56, True, "f32", (32, 16, 32), (16, 16), 2, tcg.MMA, {}),
    "mma-batch2-bias-relu": (2, 50, 72, 56, False, "bias_relu", (32, 64, 32), (32, 32), 2,
                             tcg.MMA, {}),
    # A[K, M] (wmma only) with rows of 29: scalar copies, one stage
    "wmma-tn-f32": (0, 29, 31, 45, False, "f32", (16, 16, 16), (16, 16), 1, tcg.WMMA,
                    {"trans_a": True}),
    # rows of 36 and 34 halves: 8- and 4-byte predicated cp.async
    "wmma-36x34-short-vectors": (0, 20, 36, 34, False, "cast", (16, 32, 32), (16, 16), 2,
                                 tcg.WMMA, {}),
    # an fp32 producer cast into the A copy (float4 loads), K padded
    "wmma-cast-producer": (0, 40, 32, 44, False, "cast", (32, 32, 32), (16, 16), 2, tcg.WMMA,
                           {"cast_producer": True}),
    # the K chunk all of K (23, 27: one chunk, padded to 32), pipelined over one step
    "wmma-whole-k-3stage": (0, 33, 19, 23, False, "cast", (32, 16, 23), (16, 16), 3, tcg.WMMA,
                            {}),
    "mma-whole-k-nt": (2, 20, 24, 27, True, "bias_relu", (16, 16, 27), (16, 16), 2, tcg.MMA, {}),
    # only K padded (no crop: the unpadded epilogue path) and only M padded
    "mma-k-only": (0, 32, 32, 40, False, "cast", (32, 32, 16), (32, 16), 3, tcg.MMA, {}),
    "wmma-m-only": (0, 40, 32, 32, False, "bias_relu", (32, 32, 32), (16, 16), 2, tcg.WMMA, {}),
}


@needs_emulator
@pytest.mark.parametrize("name", list(EMU_CASES))
def test_emulated_padded_kernels(name, tmp_path):
    from tvm.s_tir.analysis import verify_gpu_code

    from tvm_roller.hardware import gpu

    batch, M, N, K, trans_b, epi, (bm, bn, bk), (wm, wn), stages, flavour, kw = EMU_CASES[name]
    func = gemm(batch, M, N, K, trans_b, epi, **kw)
    fa = CUDA.analyze(func)
    g = tcg.gemm_structure(fa)
    l1, reg = [1] * len(fa.axes), [1] * len(fa.axes)
    l1[g.m], l1[g.n], l1[g.k] = bm, bn, bk
    reg[g.m], reg[g.n], reg[g.k] = wm, wn, 16
    tile = make_tile(fa, l1, reg, stages=stages, shape=flavour)
    assert tcg.padded_extents(fa, tile), "the case pads nothing"
    tcg.validate_tile(fa, tile, H100)
    sch = tc.apply_tensorcore(func, fa, tile)
    assert verify_gpu_code(tcp.lower_device_kernel(sch.mod, tile, tvm.target.Target("nvidia/nvidia-a100")),
                           gpu.verify_constraints(hardware.preset("a100")))
    src = check_numerics(func, fa, tile, sch,
                         lambda a: reference(a, kw.get("trans_a", False), trans_b, epi,
                                             kw.get("cast_producer", False)),
                         str(tmp_path))
    lanes = min(tcg.copy_lanes(g.a_row), tcg.copy_lanes(g.b_row))
    assert ("cp.async" in src) == (stages >= 2 and lanes >= 2)
    if "cp.async" in src and (M % bm or N % bn or K % bk):
        assert "@p cp.async" in src  # zero-filled where out of bounds


@needs_emulator
def test_emulator_catches_padding_bugs(tmp_path):
    """The checks are not vacuous: a store that lost its bounds predicate writes into the guard,
    and out-of-bounds tiles left unfilled (shared memory's garbage) spoil the result."""
    batch, M, N, K, trans_b, epi, (bm, bn, bk), (wm, wn), stages, flavour, kw = \
        EMU_CASES["wmma-nt-bias-relu"]
    func = gemm(batch, M, N, K, trans_b, epi)
    fa = CUDA.analyze(func)
    tile = make_tile(fa, [bm, bn, bk], [wm, wn, 16], stages=stages, shape=flavour)
    sch = tc.apply_tensorcore(func, fa, tile)
    src = tcp.build(sch.mod, tile, tvm.target.Target("nvidia/nvidia-a100")).mod.imports[0] \
        .inspect_source()
    arrays, out_name, out_shape, out_dtype = random_inputs(func)
    # the epilogue (after the last fragment store): its bounds checks made always true
    lines = src.splitlines()
    start = max(i for i, line in enumerate(lines) if "store_matrix_sync" in line)
    guards = [i for i in range(start, len(lines)) if re.match(r"\s*if \(.*\) \{$", lines[i])]
    assert guards
    for i in guards:
        lines[i] = "  if (1) {"
    unguarded = "\n".join(lines) + "\n"
    run = dict(grid=_grid(fa, tile), block=(32, tile.threads // 32, 1),
               smem=tcg.smem_bytes(fa, tile), arrays=arrays, out_name=out_name,
               out_shape=out_shape, out_dtype=out_dtype)
    ref = reference(arrays, False, trans_b, epi)
    got = run_emulated(src, workdir=str(tmp_path / "ok"), **run)
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 2e-3
    with pytest.raises(AssertionError, match="past the end"):
        run_emulated(unguarded, workdir=str(tmp_path / "unguarded"), **run)
    try:
        got = run_emulated(src, workdir=str(tmp_path / "unfilled"), zero_fill=False, **run)
        ok = np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 2e-3
    except AssertionError:  # NaN garbage reached the output
        ok = False
    assert not ok


def _planned(func):
    p = plan(func, H100_TARGET)
    t = p.tiles[0]
    assert t.tensor_core, t.notes
    return p, t


@needs_emulator
@pytest.mark.parametrize("case", [
    (0, 17, 19, 23, False, "cast"),
    (3, 21, 18, 29, False, "cast"),
    (0, 37, 43, 27, True, "bias_relu"),
    (2, 19, 40, 48, True, "f32"),
])
def test_planned_padded_kernels_emulated(case, tmp_path):
    """The policy's own tiles for small odd shapes (roller.plan -> roller.apply), emulated."""
    batch, M, N, K, trans_b, epi = case
    func = gemm(batch, M, N, K, trans_b, epi)
    p, t = _planned(func)
    assert any(re.match(r"tensor cores: [MNK] \(axis \S+\) padded \d+ -> \d+ \(waste ", n)
               for n in t.notes), t.notes
    sch = tvm_roller.planner.apply(p, t)
    check_numerics(func, p.analysis, t, sch, lambda a: reference(a, False, trans_b, epi),
                   str(tmp_path), arch_target=H100_TARGET)


# -- nvcc ------------------------------------------------------------------------------------------
def _nvcc_ok(func):
    from harness.cuda_check import check

    p, t = _planned(func)
    sch = tvm_roller.planner.apply(p, t)
    with tvm_roller.planner.Context.make(p.target).pass_context():
        rep = check(sch.mod, p.target)
    return p, t, rep


@needs_nvcc
@pytest.mark.parametrize("case", [
    (0, 197, 211, 97, False, "cast"),  # the usual prime mix
    (3, 131, 61, 509, True, "bias_relu"),  # batched, B transposed, odd rows: scalar copies
    (0, 1000, 1000, 1000, False, "f32"),  # rows of 1000: 16-byte predicated cp.async
])
def test_nvcc_planned_padded(case):
    p, t, rep = _nvcc_ok(gemm(*case))
    assert rep.ok and rep.tensor_core, rep.problems
    assert rep.ok_for_compute_bound(), {k: (r.spill_stores, r.stack_frame)
                                        for k, r in rep.ptxas.kernels.items()}


def test_aligned_shapes_pad_nothing():
    for shape in [(0, 1024, 1024, 1024), (0, 128, 3072, 768), (8, 512, 512, 512)]:
        p, t = _planned(gemm(*shape))
        assert not tcg.padded_extents(p.analysis, t) and not any("padded" in n for n in t.notes)


# -- random shapes ---------------------------------------------------------------------------------
PRIMES = [p for p in range(17, 1024) if all(p % d for d in range(2, int(p ** 0.5) + 1))]


def random_cases(n=48, seed=2024):
    """Seeded random fp16 matmuls: each extent prime (1/6), odd (1/6) or any size (2/3) in
    16..1024, one in ten of them small (16..80); batch 0/2/3/5; B transposed 35%; epilogues."""
    rng = random.Random(seed)

    def extent(kind):
        small = rng.random() < 0.1
        lo, hi = (16, 81) if small else (16, 1025)
        if kind == "prime":
            return rng.choice([p for p in PRIMES if lo <= p < hi])
        return rng.randrange(lo + 1, hi, 2) if kind == "odd" else rng.randrange(lo, hi)

    out = []
    for _ in range(n):
        M, N, K = (extent(rng.choice(["prime", "odd", "any", "any", "any", "any"]))
                   for _ in range(3))
        out.append((rng.choice([0, 0, 0, 2, 3, 5]), M, N, K, rng.random() < 0.35,
                    rng.choice(["cast", "cast", "f32", "bias_relu"])))
    return out


def test_random_shapes_plan_tensor_cores():
    cases = random_cases()
    tc_cases = [c for c in cases if plan(gemm(*c), H100_TARGET).tiles[0].tensor_core]
    assert len(tc_cases) >= 0.9 * len(cases), sorted(set(cases) - set(tc_cases))


@needs_nvcc
@pytest.mark.slow
def test_random_shapes_compile_on_tensor_cores():
    cases = random_cases()
    good, bad = 0, []
    for c in cases:
        try:
            _, t, rep = _nvcc_ok(gemm(*c))
            ok = rep.ok and rep.tensor_core
        except (AssertionError, UnsupportedError) as err:
            ok, rep = False, err
        good += ok
        if not ok:
            bad.append((c, getattr(rep, "problems", rep)))
    assert good >= 0.9 * len(cases), bad
