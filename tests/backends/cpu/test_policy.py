"""The construction policy: alignment rules, the reuse-score scale-up, scale-out, determinism,
RTile serialisation, and what ``explain`` reports."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from tvm import te
from tvm.s_tir.meta_schedule.testing import te_workload as W

import tvm_roller
from tvm_roller import hardware
from tvm_roller.analysis import analyze
from tvm_roller.analysis.traffic import num_tiles
from tvm_roller.backends.cpu.policy import _scale_out
from tvm_roller.backends.cpu.policy_conv import _RIVAL_MARGIN
from tvm_roller.backends.registry import backend_for
from tvm_roller.hardware import normalize_target
from tvm_roller.core.growth import grow_by_reuse
from tvm_roller.core.rtile import RTile, aligned_steps, padding_waste

from conftest import REPO_ROOT, TARGET, device

DEFAULT_MULTIPLES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 48, 64, 96, 128)


def construct(fa, dev, topk=1):
    """The CPU backend's construction for ``fa`` (the rule that takes it)."""
    return backend_for(normalize_target("llvm")).rule_for(fa).construct(fa, dev, topk)


def _fa(tensors):
    return analyze(te.create_prim_func(list(tensors)))


# -- alignment -----------------------------------------------------------------------------------
def test_padding_waste():
    assert padding_waste(64, 16) == 0
    assert padding_waste(100, 16) == pytest.approx(12 / 100)  # 7 * 16 = 112
    assert padding_waste(7, 8) == pytest.approx(1 / 7)


@pytest.mark.parametrize("extent,base,eps,limit", [
    (64, 16, 0.25, None), (100, 16, 0.25, None), (100, 16, 0.05, None), (1000, 16, 0.05, None),
    (1024, 16, 0.25, 64), (1024, 16, 0.0, 64), (224, 8, 0.0, None), (97, 4, 0.1, None),
    (48, 1, 0.0, None),
])
def test_aligned_steps_rules(extent, base, eps, limit):
    steps = aligned_steps(extent, base, limit=limit, eps=eps)
    assert steps == sorted(set(steps)) and steps
    cap = extent if limit is None else min(limit, extent)
    for t in steps:
        if t == extent:
            continue  # the full extent is always allowed
        assert t % base == 0, f"{t} is not a multiple of the alignment unit {base}"
        assert t <= cap
        assert extent % t == 0 or padding_waste(extent, t) <= eps, \
            f"{t} pads {extent} by {padding_waste(extent, t):.0%} > eps {eps:.0%}"
    # and nothing allowed is left out
    for m in DEFAULT_MULTIPLES:
        t = m * base
        if t <= cap and (extent % t == 0 or padding_waste(extent, t) <= eps):
            assert t in steps
    assert (extent in steps) == (extent <= cap)


def test_aligned_steps_examples():
    assert aligned_steps(64, 16) == [16, 32, 64]  # SIMD multiples that divide
    assert aligned_steps(100, 16) == [16, 100]  # 16 pads 100 -> 112 (12% <= 25%); 32 would pad 28%
    assert aligned_steps(100, 16, eps=0.05) == [100]  # no multiple of 16 within 5%: take it whole
    assert aligned_steps(1024, 16, limit=64) == [16, 32, 48, 64]  # 48 pads 3%
    assert aligned_steps(1024, 16, limit=64, eps=0.0) == [16, 32, 64]


@pytest.mark.parametrize("extent", [1, 2, 3, 7, 13, 31])
def test_aligned_steps_small_and_prime_axes(extent):
    if extent < 16:  # shorter than one vector: the axis is taken whole
        assert aligned_steps(extent, 16) == [extent]
    else:  # 31 -> one 16-lane step padded to 32 (3% waste) or the whole axis
        assert aligned_steps(extent, 16) == [16, 31]
        assert aligned_steps(extent, 16, eps=0.0) == [31]
    # a prime axis with unit alignment and no padding allowed: 1 or the whole axis
    assert aligned_steps(extent, 1, eps=0.0, multiples=range(1, 65)) == sorted({1, extent})


def test_register_tile_is_simd_aligned():
    dev = device()
    for dtype, lanes in (("float32", 16), ("float64", 8)):
        fa = _fa(W.matmul(96, 160, 64, dtype, dtype))
        v = fa.vector_axis
        assert fa.axes[v].name.endswith("j")
        for t in construct(fa, dev, topk=3):
            assert t.vector_lanes == lanes
            assert t.reg[v] % lanes == 0, t.reg
            for i in fa.spatial:  # each level is a multiple of the one below (or the whole axis)
                assert t.l1[i] % t.reg[i] == 0 or t.l1[i] == fa.axes[i].extent
                assert t.l2[i] % t.l1[i] == 0 or t.l2[i] == fa.axes[i].extent
    fa = _fa(W.matmul(32, 7, 64))  # vector axis shorter than a vector register: taken whole
    t = construct(fa, dev)[0]
    assert t.reg[fa.vector_axis] == 7
    assert any("shorter than 16 lanes" in n for n in t.notes)


# -- scale-up by reuse score ---------------------------------------------------------------------
def _reference_greedy(start, steps, q, f, fits):
    """The rule written out: take the enlargement with the best S_i = dQ / dF."""
    path, cur = [tuple(start)], tuple(start)
    while True:
        best = None
        for i, sizes in enumerate(steps):
            bigger = [s for s in sizes if s > cur[i]]
            if not bigger:
                continue
            nxt = cur[:i] + (bigger[0],) + cur[i + 1:]
            if not fits(nxt):
                continue
            dq, df = q(cur) - q(nxt), f(nxt) - f(cur)
            if dq <= 0:
                continue
            score = dq / df if df > 0 else float("inf")
            if best is None or score > best[0]:  # strict: the earlier axis wins ties
                best = (score, nxt)
        if best is None:
            return path
        cur = best[1]
        path.append(cur)


def test_grow_picks_best_reuse_score():
    steps = [[1, 2, 4, 8], [1, 2, 4, 8]]
    q = lambda t: 100.0 / t[0] + 10.0 / t[1]  # axis 0 cuts traffic 10x more per step
    f = lambda t: t[0] + t[1]
    path = grow_by_reuse((1, 1), steps, q, f, lambda t: True)
    # S_0 = 50 vs S_1 = 5, then 12.5 vs 5, then 3.125 vs 5 -> axis 1
    assert path[:4] == [(1, 1), (2, 1), (4, 1), (4, 2)]
    assert path == _reference_greedy((1, 1), steps, q, f, lambda t: True)
    assert path[-1] == (8, 8)


def test_grow_other_axis_first():
    steps = [[1, 2, 4, 8], [1, 3, 9]]
    q = lambda t: 10.0 / t[0] + 90.0 / t[1]
    f = lambda t: t[0] * t[1]
    path = grow_by_reuse((1, 1), steps, q, f, lambda t: True)
    assert path[1] == (1, 3)  # S_1 = 60 / 2 = 30 beats S_0 = 5 / 1
    assert path == _reference_greedy((1, 1), steps, q, f, lambda t: True)


def test_grow_respects_capacity_and_ties():
    steps = [[1, 2, 4, 8, 16]] * 3
    q = lambda t: sum(64.0 / x for x in t)  # symmetric: ties everywhere
    f = lambda t: t[0] * t[1] * t[2]
    fits = lambda t: f(t) <= 32
    path = grow_by_reuse((1, 1, 1), steps, q, f, fits)
    assert path[1] == (2, 1, 1)  # a tie goes to the earlier axis, deterministically
    assert all(fits(t) for t in path)
    last = path[-1]
    for i in range(3):  # maximal: no single next step still fits
        nxt = list(last)
        nxt[i] = next((s for s in steps[i] if s > last[i]), None)
        assert nxt[i] is None or not fits(tuple(nxt))
    assert path == _reference_greedy((1, 1, 1), steps, q, f, fits)


def test_grow_stops_without_gain():
    steps = [[1, 2, 4]]
    path = grow_by_reuse((1,), steps, lambda t: 5.0, lambda t: float(t[0]), lambda t: True)
    assert path == [(1,)]


# -- scale-out -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cores", [2, 8, 20])
@pytest.mark.parametrize("wl", ["mm256", "c2d", "gmm"])
def test_scale_out_feeds_every_core(cores, wl):
    tensors = {"mm256": W.matmul(256, 256, 256),
               "c2d": W.conv2d_nhwc(1, 28, 28, 64, 64, 3, 1, 1),
               "gmm": W.batch_matmul_nkkm(4, 128, 128, 64)}[wl]
    fa = _fa(tensors)
    dev = hardware.preset("x86-avx512").with_units(cores)
    for t in construct(fa, dev, topk=3):
        assert t.num_tasks == num_tiles(fa, t.l2, fa.spatial)
        assert t.num_tasks >= cores, (t.reg, t.l1, t.l2)


@pytest.mark.parametrize("cores", [2, 20])
def test_scale_out_limited_by_register_tiles(cores):
    """Small problems: as many tasks as there are register tiles, up to the core count."""
    for shape in [(1, 1024, 64), (16, 16, 16), (1, 16, 16), (64, 64, 64)]:
        fa = _fa(W.matmul(*shape))
        for t in construct(fa, hardware.preset("x86-avx512").with_units(cores), topk=3):
            assert t.num_tasks >= min(cores, num_tiles(fa, t.l1, fa.spatial)), (shape, t.l1, t.l2)


def test_scale_out_direct():
    fa = _fa(W.matmul(256, 256, 256))
    l1 = (16, 32, 32)
    for cores in (1, 2, 3, 8, 20):
        l2 = _scale_out(fa, l1, (256, 256, 32), cores)
        n = num_tiles(fa, l2, fa.spatial)
        assert n >= cores
        assert n / (-(-n // cores) * cores) >= 0.9 or l2[:2] == l1[:2]  # little wave loss
        for i in fa.spatial:  # whole L1 tiles per task
            assert l2[i] % l1[i] == 0 and l2[i] >= l1[i]
    # nothing to split: the task tile is already one L1 tile
    assert _scale_out(fa, (256, 256, 32), (256, 256, 32), 8) == (256, 256, 32)


# -- determinism and serialisation ---------------------------------------------------------------
_WLS = {"mm": lambda: W.matmul(127, 129, 67), "c2d": lambda: W.conv2d_nhwc(1, 14, 14, 32, 48, 3, 1, 1),
        "sfm": lambda: W.softmax_mn(64, 100), "t2d": lambda: W.conv2d_transpose_nhwc(1, 8, 8, 32, 16, 4, 2, 1)}


@pytest.mark.parametrize("wl", sorted(_WLS))
def test_construction_is_deterministic(wl):
    a = [t.to_json() for t in tvm_roller.plan(te.create_prim_func(list(_WLS[wl]())), TARGET,
                                              topk=3, device=device()).tiles]
    b = [t.to_json() for t in tvm_roller.plan(te.create_prim_func(list(_WLS[wl]())), TARGET,
                                              topk=3, device=device()).tiles]
    assert a == b
    # the ranking is by predicted time; a convolution's own tile leads unless a generic tile
    # is predicted clearly faster
    preds = [json.loads(x)["predicted_s"] for x in a]
    assert preds[1:] == sorted(preds[1:])
    assert preds[0] <= min(preds) / (1.0 - _RIVAL_MARGIN)


def test_construction_is_deterministic_across_processes():
    code = textwrap.dedent("""
        import json
        from tvm import te
        from tvm.s_tir.meta_schedule.testing import te_workload as W
        import tvm_roller
        f = te.create_prim_func(list(W.conv2d_nhwc(1, 14, 14, 32, 48, 3, 1, 1)))
        dev = tvm_roller.hardware.preset("x86-avx512")
        print(json.dumps([t.to_json() for t in tvm_roller.plan(f, %r, topk=3, device=dev).tiles]))
    """) % (TARGET,)
    root = str(REPO_ROOT)
    env = dict(os.environ, PYTHONHASHSEED="12345",
               PYTHONPATH=os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "")
                                                    .split(os.pathsep) if p]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300, check=True).stdout.strip().splitlines()[-1]
    here = [t.to_json() for t in tvm_roller.plan(
        te.create_prim_func(list(W.conv2d_nhwc(1, 14, 14, 32, 48, 3, 1, 1))), TARGET, topk=3,
        device=device()).tiles]
    assert json.loads(out) == here


@pytest.mark.parametrize("wl", sorted(_WLS))
def test_rtile_json_round_trip(wl):
    for t in tvm_roller.plan(te.create_prim_func(list(_WLS[wl]())), TARGET, topk=3,
                             device=device()).tiles:
        text = t.to_json()
        json.loads(text)  # plain JSON
        back = RTile.from_json(text)
        assert back == t and back.to_json() == text and back.key() == t.key()


def test_rtile_json_round_trip_hand_made():
    t = RTile(kind="tiled", axes=["i", "j", "k"], extents=[64, 48, 32], axis_kinds="SSR",
              reg=[4, 16, 1], l1=[16, 48, 32], l2=[32, 48, 32], vector_axis=1, vector_lanes=16,
              pack=["B"], predicted_s=1.5e-6, bound="L2", terms={"L2": 1.5e-6}, notes=["n"])
    assert RTile.from_json(t.to_json()) == t


# -- analysis facts the policy relies on ---------------------------------------------------------
def test_analysis_footprints():
    fa = _fa(W.matmul(256, 256, 256))
    assert [(a.name, a.extent, a.kind) for a in fa.axes] == [("v_i", 256, "S"), ("v_j", 256, "S"),
                                                             ("v_k", 256, "R")]
    assert fa.vector_axis == 1 and fa.kind == "tiled"
    assert fa.footprint((4, 16, 8)) == {"A": 4 * 8, "B": 8 * 16, "C": 4 * 16}
    fc = _fa(W.conv2d_nhwc(1, 16, 16, 8, 16, 3, 2, 1))  # stride 2: input rows (t-1)*2 + 3
    fp = fc.footprint((1, 2, 3, 16, 3, 3, 8))
    assert fp["PadInput"] == 1 * 5 * 7 * 8 and fp["weight"] == 3 * 3 * 8 * 16
    assert fp["conv2d_nhwc"] == 2 * 3 * 16
    assert fc.producers == ["PadInput"] and fc.main == "conv2d_nhwc"
    assert _fa(W.softmax_mn(8, 32)).kind == "reduction"


# -- explain -------------------------------------------------------------------------------------
def test_explain_reports_tiles_prediction_and_bound():
    f = te.create_prim_func(list(W.matmul(128, 128, 128)))
    text = tvm_roller.explain(f, TARGET, device=device())
    low = text.lower()
    for word in ("register tile", "l1 tile", "predicted", "bound by", "vector axis", "skylake-avx512"):
        assert word in low, f"{word!r} missing from:\n{text}"
    assert "note:" not in text  # a complete target needs no completion notes


def test_explain_streaming_kind():
    text = tvm_roller.explain(te.create_prim_func(list(W.softmax_mn(64, 64))), TARGET,
                              device=device())
    assert "reduction" in text and "predicted" in text and "bound by" in text


def test_explain_completes_llvm_target_without_mcpu():
    f = te.create_prim_func(list(W.matmul(64, 64, 64)))
    host = hardware.cpu.host_cpu()
    for dev in (device(), None):
        text = tvm_roller.explain(f, {"kind": "llvm"}, device=dev)
        assert "mcpu was not given" in text and host in text, text
        assert "num-cores was not given" in text
