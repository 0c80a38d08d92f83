"""The attention family of the random cases (``harness.random_cases.attention``): HF's eager
attention as a Relax model, drawn seeded (MHA, GQA and MQA, odd head sizes and lengths, the
masks HF makes, a scale multiplied or divided), its float64 reference held against PyTorch's
own attention, and a few cases compiled by roller's pipeline: as the flash-attention kernel, or
left to the matmul chains with the pass's reason, each correct, and a wrong answer caught."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.random_cases import attention, check_cpu, families, report
from harness.random_cases.case import OK, WRONG, Case, Result

SEED = 44


def _cases(n: int = 120):
    return families.generate(SEED, n, "cpu", ["attention"])


def test_cases_are_seeded_and_cover_the_forms():
    cases = _cases()
    assert cases == _cases() and _cases(13) == cases[:13]  # case i does not depend on n
    for c in cases[:20]:
        assert Case.from_json(c.to_json()) == c
        json.dumps(c.params)
    p = [c.params for c in cases]
    assert {x["kv"] for x in p} == {"mha", "repeat", "broadcast"}
    assert any(1 < x["KVH"] < x["H"] for x in p)  # GQA
    assert all(x["H"] % x["KVH"] == 0 for x in p)
    assert {x["mask"] for x in p} == set(families.ATTENTION_MASKS)
    assert {x["scale"] for x in p} == {"multiply", "divide", "none"}
    assert {x["form"] for x in p} == {"rank4", "torch", "folded"}
    assert {x.get("fill") for x in p} == {None, "min", "-1e9", "-10000"}
    assert {x.get("empty") for x in p} == {None, 0, 1}
    assert {1, 40, 72, 80, 96}.issubset({x["D"] for x in p})
    lengths = [x["SQ"] for x in p] + [x["SK"] for x in p]
    assert 1 in lengths and max(lengths) <= 300
    assert sum(n % 2 for n in lengths) > 0.2 * len(lengths)
    assert any(x["SQ"] != x["SK"] for x in p) and {x["B"] for x in p} == {1, 2, 3}
    assert {c.dtype for c in cases} == {"float32", "float64"}


def test_cuda_runs_leave_attention_out():
    assert "attention" not in {c.family for c in families.generate(0, 60, "cuda")}
    with pytest.raises(ValueError, match="CPU only"):
        families.generate(0, 3, "cuda", ["attention"])
    with pytest.raises(ValueError, match="Relax model"):
        families.make_func(_cases(1)[0])


def test_masks_are_hf_shaped_and_only_the_minimum_masks_a_whole_row():
    """0 where attended and the fill where masked, in HF's shapes; a row masked everywhere
    exactly when the case says so (``empty``), and only with the dtype's minimum: -1e9 added
    to every score of a row keeps them apart in float64 and not in float32."""
    for c in _cases():
        arrays = attention.inputs(c)
        shapes = attention.shapes(c.params)
        assert [a.shape for a in arrays] == list(shapes.values())
        assert all(a.dtype == c.dtype and np.all(a != 0) for a in arrays[:3])
        mask = attention.mask_values(c)
        if c.params["mask"] in ("none", "head_bias"):
            continue
        assert mask.shape == families.attention_mask_shape(c.params)
        fill = np.finfo(c.dtype).min if c.params["fill"] == "min" else float(c.params["fill"])
        assert set(np.unique(mask)) <= {0.0, fill}
        assert bool((mask == fill).all(-1).any()) == bool(c.params["empty"]), c.label()
        assert c.params["fill"] == "min" or not c.params["empty"]


def _torch_reference(case: Case, arrays) -> np.ndarray:
    """PyTorch's own attention in float64 (K and V heads repeated by ``enable_gqa``)."""
    torch = pytest.importorskip("torch")
    p = case.params
    b, h, hd, sq = (int(p[n]) for n in ("B", "H", "D", "SQ"))
    q, k, v = (torch.from_numpy(a.astype(np.float64)).reshape(b, -1, a.shape[-2], hd)
               for a in arrays[:3])
    mask = None if len(arrays) == 3 else torch.from_numpy(
        arrays[3].astype(np.float64)).reshape(families.attention_mask_shape(p))
    const = float(p.get("const", 1.0))
    scale = {"multiply": const, "divide": 1.0 / const, "none": 1.0}[str(p["scale"])]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=True).numpy()
    if p["form"] == "torch":
        return out.transpose(0, 2, 1, 3).reshape(b, sq, h * hd)
    return out.reshape(attention.shapes(p)["q"])


def test_reference_matches_pytorch_attention():
    for c in _cases(30):
        arrays = attention.inputs(c)
        ref, want = attention.reference(c, arrays), _torch_reference(c, arrays)
        assert np.abs(ref - want).max() <= 1e-12 * np.abs(want).max(), c.label()


def _case(dtype: str, **params) -> Case:
    return Case(SEED, 0, "attention", dtype, "cpu", params)


DECLINED_RANK = "flash attention declined: attention operands of rank 3 or 4 with known shapes"
CHECKED = [  # (case, how roller builds it)
    # a whole batch entry padded (its rows masked everywhere), more keys than queries
    (_case("float32", B=2, H=3, KVH=3, D=72, SQ=37, SK=53, kv="mha", mask="padding", empty=1,
           fill="min", scale="multiply", const=repr(72 ** -0.5), form="rank4"), attention.FLASH),
    # MQA broadcast by the matmul; causal over more queries than keys: the first rows masked
    (_case("float32", B=1, H=4, KVH=1, D=40, SQ=29, SK=13, kv="broadcast", mask="causal",
           mask_batch=1, empty=1, fill="min", scale="divide", const=repr(math.sqrt(40)),
           form="rank4"), attention.FLASH),
    # torch.export's rank-3 views, causal and left padding at -1e9, head size 1
    (_case("float32", B=2, H=2, KVH=2, D=1, SQ=17, SK=17, kv="mha", mask="causal_padding",
           empty=0, fill="-1e9", scale="none", form="torch"), attention.FLASH),
    # GQA as HF's repeat_kv: the kernel reads the two kv heads unrepeated
    (_case("float32", B=1, H=6, KVH=2, D=16, SQ=11, SK=23, kv="repeat", mask="head_bias",
           mask_batch=1, scale="multiply", const="0.25", form="torch"), attention.FLASH),
    (_case("float64", B=1, H=3, KVH=3, D=80, SQ=7, SK=31, kv="mha", mask="random", empty=1,
           fill="min", scale="multiply", const="2.0", form="folded"),
     "flash attention declined: flash attention is float32; the operands are ['float64']"),
    # MQA broadcast inside torch.export's views: the one head read unrepeated
    (_case("float32", B=2, H=3, KVH=1, D=64, SQ=5, SK=9, kv="broadcast", mask="none",
           scale="multiply", const="0.125", form="torch"), attention.FLASH),
]


@pytest.mark.parametrize("case,route", CHECKED, ids=[f"{c.dtype}-{c.params['form']}-"
                                                     f"{c.params['kv']}-{c.params['mask']}"
                                                     for c, _ in CHECKED])
def test_checked_case_is_ok_and_says_how_it_was_built(case, route):
    r = check_cpu.check(case)
    assert r.outcome == OK, (r.outcome, r.stage, r.message)
    assert r.facts["attention"] == route
    assert r.facts["flash_kernels"] == (route == attention.FLASH)
    assert r.max_err <= r.tol and r.facts["fallbacks"] == 0


def test_wrong_answer_is_caught_and_the_summary_counts_the_routes():
    good = check_cpu.check(CHECKED[1][0])
    bad = check_cpu.check(Case.from_dict({**json.loads(CHECKED[1][0].to_json()),
                                          "index": 1, "inject": "wrong"}))
    assert bad.outcome == WRONG and bad.max_err > bad.tol
    declined = Result(_case("float32"), OK, facts={"attention": DECLINED_RANK})
    s = report.summarize([good, bad, declined])
    text = report.text(s)
    assert "attention as the flash-attention kernel: 2 of 3" in text
    assert f"attention left to the matmul chains (1): {DECLINED_RANK}" in text
    assert s.failed and "flash-attention kernel" in report.markdown(s)


def test_built_for_another_architecture_is_not_run():
    """Built for AArch64 on an x86 host: the model's kernels compiled to machine code, the case
    counted as not_run, still saying how roller built the attention."""
    from harness.random_cases import targets
    from harness.random_cases.case import NOT_RUN

    aarch64 = targets.parse('{"kind":"llvm","mtriple":"aarch64-linux-gnu","mattr":["+neon"]}')
    if targets.host_arch() == "aarch64":
        pytest.skip("this host is AArch64: it runs the case")
    case = Case.from_dict({**json.loads(CHECKED[1][0].to_json()), "llvm_target": aarch64})
    r = check_cpu.check(case)
    assert r.outcome == NOT_RUN and r.stage == "codegen", (r.outcome, r.message)
    assert "aarch64 code" in r.message and r.facts["attention"] == attention.FLASH
