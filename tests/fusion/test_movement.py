"""The Chimera data-movement model for fused operator chains (tvm_roller.fusion.movement).

Pure Python: no TVM build, no measurement; every test runs in milliseconds (the TVM import
behind ``tvm_roller.hardware`` dominates)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO_ROOT
from tvm_roller.fusion import (Chain, ChainPlan, Loop, Op, TensorUse, conv_chain, data_movement,
                               format_plan, gemm_chain, memory_usage, mlp_chain, plan_chain,
                               tile_candidates)
from tvm_roller.hardware import preset

MiB = 1 << 20


@pytest.fixture(scope="module")
def dev():
    return preset("x86-avx512")


@pytest.fixture(scope="module")
def plans(dev):
    chains = {
        "attention": gemm_chain(12, 512, 64, 512, 64),  # intermediate 12x512x512 fp32 = 12 MiB
        "mlp": mlp_chain(128, 768, 3072),  # intermediate 128x3072 fp32 = 1.5 MiB
        "small": gemm_chain(1, 64, 32, 64, 32),  # intermediate 64x64 fp32 = 16 KiB
    }
    out = {}
    for key, ch in chains.items():
        t0 = time.perf_counter()
        p = plan_chain(ch, dev)
        out[key] = (ch, p, time.perf_counter() - t0)
    return out


# -- the model against Chimera's closed form ----------------------------------------------------
def _closed_form(M, K, L, N, TM, TL, elem=4):
    """Chimera: DV = MK ceil(L/TL) + KL ceil(M/TM) + NL ceil(M/TM) + MN ceil(L/TL), order mlkn."""
    return {"A": M * K * math.ceil(L / TL) * elem, "B": K * L * math.ceil(M / TM) * elem,
            "C": 0, "D": N * L * math.ceil(M / TM) * elem, "E": M * N * math.ceil(L / TL) * elem}


def test_closed_form_gemm_chain():
    ch = gemm_chain(1, 256, 32, 384, 128)  # M, K, L, N
    # tiles TM=64, TL=128, TK=16, TN=64 (by hand: A 256*32*3, B 32*384*4, D 128*384*4,
    # E 256*128*3 elements, 4 bytes each)
    dm = data_movement(ch, ["m", "l", "k", "n"], {"m": 64, "l": 128, "k": 16, "n": 64})
    assert dm == {"A": 98304, "B": 196608, "C": 0, "D": 786432, "E": 393216}
    assert sum(dm.values()) == 1474560
    assert dm == _closed_form(256, 32, 384, 128, 64, 128)
    # TM=32, TL=L, TK=K, TN=32: A and E once, B and D 8 times
    dm = data_movement(ch, ["m", "l", "k", "n"], {"m": 32, "l": 384, "k": 32, "n": 32})
    assert dm == {"A": 32768, "B": 393216, "C": 0, "D": 1572864, "E": 131072}
    assert dm == _closed_form(256, 32, 384, 128, 32, 384)
    # fused=False charges the intermediate like any tensor: M*L once here (k and n inside l)
    dm = data_movement(ch, ["m", "l", "k", "n"], {"m": 32, "l": 384, "k": 32, "n": 32},
                       fused=False)
    assert dm["C"] == 256 * 384 * 4


def test_closed_form_with_batch():
    ch = gemm_chain(3, 256, 32, 384, 128)
    dm = data_movement(ch, ["b", "m", "l", "k", "n"],
                       {"b": 1, "m": 64, "l": 128, "k": 16, "n": 64})
    assert dm == {k: 3 * v for k, v in _closed_form(256, 32, 384, 128, 64, 128).items()}


def test_private_loops_do_not_multiply_the_other_op():
    ch = gemm_chain(1, 256, 32, 384, 128)
    base = data_movement(ch, ["m", "l", "k", "n"], {"m": 64, "l": 128, "k": 32, "n": 128})
    # tiling k (private to gemm1) leaves gemm2's tensors alone, and tiling n leaves gemm1's
    dk = data_movement(ch, ["m", "l", "k", "n"], {"m": 64, "l": 128, "k": 8, "n": 128})
    dn = data_movement(ch, ["m", "l", "k", "n"], {"m": 64, "l": 128, "k": 32, "n": 16})
    assert dk == base and dn == base


def test_memory_usage_formula():
    ch = gemm_chain(1, 256, 32, 384, 128)
    tiles = {"m": 64, "l": 128, "k": 16, "n": 64}
    # max(TM TK + TK TL + TM TL, TM TL + TL TN + TM TN) * 4 bytes
    assert memory_usage(ch, tiles) == max(64 * 16 + 16 * 128 + 64 * 128,
                                          64 * 128 + 128 * 64 + 64 * 64) * 4


def test_tile_candidates_are_near_divisors():
    for e in (12, 56, 64, 97, 196, 512, 768, 3072):
        c = tile_candidates(e)
        assert c[0] == 1 and c[-1] == e and c == sorted(set(c))
        assert all((math.ceil(e / t) * t - e) / e <= 0.10 + 1e-12 for t in c)
        assert len(c) <= 2 * e.bit_length() + 2
    assert tile_candidates(512) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


# -- planning ----------------------------------------------------------------------------------
def test_capacity_respected(plans):
    for ch, p, _ in plans.values():
        assert p.tile_level == "L2"
        assert p.tile_capacity_bytes == 512 * 1024  # half of the 1 MiB L2 per core
        assert p.memory_usage_bytes <= p.tile_capacity_bytes
        assert memory_usage(ch, p.tiles) == p.memory_usage_bytes
        assert memory_usage(ch, p.least_tiles) <= p.tile_capacity_bytes
        for u in p.unfused_ops:
            assert u["memory_usage_bytes"] <= p.tile_capacity_bytes
        # the reported volumes are the model's for the reported order and tiles
        assert data_movement(ch, p.order, p.tiles) == p.volume_fused
        assert data_movement(ch, p.least_order, p.least_tiles) == p.least_volume_fused


def test_small_intermediate_not_fused(plans):
    _, p, _ = plans["small"]
    assert p.intermediates[0]["fits_tile_level"]
    assert not p.fuse
    assert p.least_total_fused >= 0.95 * p.least_total_unfused  # fusing saves (almost) nothing
    assert "fits L2" in p.reason


@pytest.mark.parametrize("key", ["attention", "mlp"])
def test_large_chains_fused_traffic_lower(plans, key):
    ch, p, _ = plans[key]
    inter = p.intermediates[0]
    assert not inter["fits_tile_level"]
    assert p.volume_fused[inter["name"]] == 0 and p.least_volume_fused[inter["name"]] == 0
    # unfused: written once and read back at least once
    assert p.least_volume_unfused[inter["name"]] >= 2 * inter["bytes"]
    assert p.least_total_fused < p.least_total_unfused
    assert "does not fit L2" in p.reason


def test_attention_chain_numbers(plans):
    _, p, _ = plans["attention"]
    assert p.intermediates[0]["bytes"] == 12 * MiB
    # least traffic: the unfused intermediate alone moves 24 MiB; fused moves 12 MiB in all
    assert p.least_total_fused <= 12 * MiB < 30 * MiB <= p.least_total_unfused
    # the best (parallel) fused plan also moves less than the best unfused one
    assert p.total_fused < p.total_unfused
    assert p.level_volume_fused["L3<-DRAM"] == 6 * MiB  # inputs and output, once each
    # on 20 cores at the preset's peak the chain is compute-bound: no gain from fusing
    assert p.bound_fused == "compute" and not p.fuse
    # Chimera's movement-only time does fuse it
    q = plan_chain(gemm_chain(12, 512, 64, 512, 64), preset("x86-avx512"),
                   include_compute=False)
    assert q.fuse and q.time_fused_s < 0.95 * q.time_unfused_s
    assert "compute" not in q.terms_fused and q.compute_fused_s > 0


def test_conv_chain(dev):
    ch = conv_chain(1, 56, 56, 64, 64, 256)
    p = plan_chain(ch, dev)
    assert p.tiles["r"] == 3 and p.tiles["s"] == 3  # the window is never tiled
    assert p.memory_usage_bytes <= p.tile_capacity_bytes
    assert p.volume_fused["Y"] == 0
    assert p.least_total_fused < p.least_total_unfused
    assert p.plan_s < 1.0


def test_three_op_chain_completes_each_intermediate(dev):
    # C = A.B (m,k,l); E = C.D (m,l,n); G = E.F (m,n,p): E is reduced over l before G reads it
    ch = Chain([Loop("m", 256), Loop("k", 64), Loop("l", 256), Loop("n", 64), Loop("p", 128)],
               [TensorUse("A", ("m", "k"), 4, "input"), TensorUse("B", ("k", "l"), 4, "input"),
                TensorUse("C", ("m", "l"), 4, "intermediate"),
                TensorUse("D", ("l", "n"), 4, "input"),
                TensorUse("E", ("m", "n"), 4, "intermediate"),
                TensorUse("F", ("n", "p"), 4, "input"), TensorUse("G", ("m", "p"), 4, "output")],
               [Op("g1", ("m", "l", "k"), ("k",), ("A", "B", "C")),
                Op("g2", ("m", "n", "l"), ("l",), ("C", "D", "E")),
                Op("g3", ("m", "p", "n"), ("n",), ("E", "F", "G"))])
    p = plan_chain(ch, dev)
    assert p.tiles["l"] == 256 and p.least_tiles["l"] == 256
    assert p.volume_fused["C"] == p.volume_fused["E"] == 0
    assert p.memory_usage_bytes <= p.tile_capacity_bytes and len(p.unfused_ops) == 3


def test_planning_time(plans):
    for ch, p, wall in plans.values():
        assert wall < 1.0 and p.plan_s < 1.0, ch.name


def test_json_round_trip(plans):
    for ch, p, _ in plans.values():
        d = json.loads(json.dumps(p.to_dict()))
        assert d == p.to_dict()
        q = ChainPlan.from_dict(d)
        assert q == p
        assert json.loads(p.to_json())["fuse"] == p.fuse
        assert Chain.from_dict(json.loads(json.dumps(ch.to_dict()))) == ch


def test_format_plan(plans):
    _, p, _ = plans["attention"]
    text = format_plan(p)
    assert "do not fuse" in text.splitlines()[0]
    assert "order (outer->inner): b m l k n" in text
    for name in "ABCDE":
        assert f"\n    {name} " in text
    assert "L2<-L3" in text and "L1<-L2" in text and "L3<-DRAM" in text


def test_single_op_and_validation(dev):
    ch = Chain([Loop("m", 64), Loop("n", 64), Loop("k", 64)],
               [TensorUse("A", ("m", "k"), 4, "input"), TensorUse("B", ("k", "n"), 4, "input"),
                TensorUse("C", ("m", "n"), 4, "output")],
               [Op("gemm", ("m", "n", "k"), ("k",), ("A", "B", "C"))])
    p = plan_chain(ch, dev)
    assert not p.fuse and "nothing to fuse" in p.reason
    bad = gemm_chain(1, 64, 32, 64, 32)
    bad.ops[1] = Op("gemm2", ("b", "m", "n"), (), ("C", "D", "E"))  # D is indexed by l
    with pytest.raises(ValueError, match="does not iterate"):
        plan_chain(bad, dev)


# the modules of the model (movement's docstring, "Where things are"): none may import TVM
_MODEL_MODULES = ("movement", "chain_spec", "chain_builders", "tile_sizes", "problem",
                  "tile_search", "chain_volume", "levels", "inner_tiling", "timing", "planning",
                  "chain_plan", "plan_format")


def test_module_does_not_import_tvm():
    names = ", ".join(f"tvm_roller.fusion.{m}" for m in _MODEL_MODULES)
    code = (f"import sys, {names}\n"  # a fresh interpreter: nothing imported TVM before
            "from tvm_roller.fusion.movement import gemm_chain\n"
            "assert gemm_chain(1, 8, 8, 8, 8).flops() > 0\n"
            "assert not any(k == 'tvm' or k.startswith('tvm.') for k in sys.modules), 'tvm'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO_ROOT)
