"""tvm_roller.llm: greedy tokens identical to HF's generate, sampling, stops and bad input."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tvm_roller.llm as llm  # noqa: E402
from conftest import device_for  # noqa: E402
from tvm_roller.core.errors import UnsupportedError  # noqa: E402
from tvm_roller.hardware import host_target  # noqa: E402

MAX_SEQ = 48


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                                   max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg).eval()


def _gpt2():
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(n_embd=48, n_layer=2, n_head=4, vocab_size=89, n_positions=128)
    return transformers.GPT2LMHeadModel(cfg).eval()


_COMPILE_FACTS: dict = {}  # what the module fixture's one compile did (files, normalisations)


@pytest.fixture(scope="module")
def llama_lm(tmp_path_factory):
    """The module's one compile, with the cache directory pointed at an empty folder and the
    target normalisations counted (``test_compile_writes_nothing_and_normalises_once``)."""
    import os
    from unittest import mock

    from tvm_roller.hardware import target as hw_target

    model = _llama()
    empty = tmp_path_factory.mktemp("llm-cache")
    calls: list = []
    real = hw_target._complete
    before = os.environ.get("TVM_ROLLER_CACHE")
    os.environ["TVM_ROLLER_CACHE"] = str(empty)
    try:
        with mock.patch.object(hw_target, "_complete",
                               lambda t: calls.append(t) or real(t)):
            lm = llm.compile(model, max_seq_len=MAX_SEQ, cache=False)
    finally:
        if before is None:
            os.environ.pop("TVM_ROLLER_CACHE")
        else:
            os.environ["TVM_ROLLER_CACHE"] = before
    _COMPILE_FACTS.update(files=[p for p in empty.rglob("*") if p.is_file()],
                          normalisations=list(calls))
    return model, lm


def test_compile_writes_nothing_and_normalises_once(llama_lm):
    """llm.compile(cache=False) reads and writes nothing under the cache directory, and the
    target is normalised once (prefill, decode and the weight checks share one Context)."""
    assert _COMPILE_FACTS["files"] == []
    assert len(_COMPILE_FACTS["normalisations"]) == 1, _COMPILE_FACTS["normalisations"]


def _hf_greedy(model, ids, new):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              pad_token_id=0)


@pytest.mark.parametrize("prompt", [1, 2, 7, 13])
def test_llama_greedy_tokens_match_hf(llama_lm, prompt):
    model, lm = llama_lm
    ids = torch.randint(0, 97, (1, prompt), generator=torch.Generator().manual_seed(prompt))
    new = MAX_SEQ - prompt
    out = lm.generate(ids, new)
    assert out.shape == (1, prompt + new) and out.dtype == ids.dtype
    assert out.tolist() == _hf_greedy(model, ids, new).tolist()
    assert lm.stats.prefill_tokens == prompt and lm.stats.decode_tokens == new - 1
    assert lm.stats.prefill_s > 0 and lm.stats.decode_s > 0
    assert all(e["status"] == "roller" or e["fallback"] == "decline" for e in lm.report)


def test_cache_is_written_in_place_and_decode_moves_no_context_copy(llama_lm):
    """The cache buffers are allocated once and written in place; in decode only the cache
    kernels see the context length (nothing else copies O(context) bytes)."""
    import numpy as np
    import tvm
    from tvm import relax

    from tvm_roller.integrations.llm.export import export_lm

    model, lm = llama_lm
    keys, values, _ = lm.buffers()
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(9))
    def by_position(blocked):  # [layers, kv, blocks, head_dim, block] -> [..., position, d]
        return blocked.transpose(0, 1, 2, 4, 3).reshape(*blocked.shape[:2], -1,
                                                        blocked.shape[3])

    before = by_position(keys.numpy().copy())
    lm.generate(ids, 4)
    after = by_position(keys.numpy())
    assert lm.buffers()[0] is keys and lm.buffers()[1] is values
    # 5 + 4 - 1 positions written (the last token is not fed back), the rest as it was
    assert (after[:, :, :8] != before[:, :, :8]).any()
    np.testing.assert_array_equal(after[:, :, 8:], before[:, :, 8:])
    kinds = {e["kind"] for e in lm.report if e["name"].startswith("decode_kv")}
    assert kinds == {"kv-write", "kv-attention"}

    mod = export_lm(model, MAX_SEQ, device_for(host_target())).mod
    symbolic = set()
    for block in mod["decode"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and value.op.name in ("relax.call_tir",
                                                                   "relax.call_tir_inplace"):
                name = value.args[0].name_hint
                shapes = [a.ty.shape for a in value.args[1].fields] + [binding.var.ty.shape]
                if any(not isinstance(d, tvm.tirx.IntImm) for sh in shapes
                       if hasattr(sh, "values") for d in sh.values):
                    symbolic.add(name)
    assert symbolic and all(n.startswith("decode_kv_") for n in symbolic), symbolic


def test_stream_eos_and_sampling(llama_lm):
    _, lm = llama_lm
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(3))
    greedy = lm.generate(ids, 10)[0, 5:].tolist()
    assert list(lm.stream(ids, 10)) == greedy
    # stops right after the eos token (an int or a list)
    stop = greedy[3]
    first = greedy.index(stop)
    assert lm.generate(ids, 10, eos_token_id=stop)[0, 5:].tolist() == greedy[:first + 1]
    assert lm.generate(ids, 10, eos_token_id=[1000, stop])[0, 5:].tolist() == greedy[:first + 1]
    # sampling: reproducible with a seed, within top-k
    a = lm.generate(ids, 8, do_sample=True, temperature=1.5, top_k=5, seed=7)
    b = lm.generate(ids, 8, do_sample=True, temperature=1.5, top_k=5, seed=7)
    assert a.tolist() == b.tolist()
    assert lm.generate(ids, 0).tolist() == ids.tolist()


@pytest.mark.parametrize("min_new", [0, 1, 4])
def test_min_new_tokens_masks_eos_as_hf_does(llama_lm, min_new):
    """``stream(min_new_tokens=k)``: no eos among the first k tokens (HF's ``min_new_tokens``);
    the eos here is the greedy first token, so without the mask generation ends at once."""
    model, lm = llama_lm
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(11))
    eos = lm.generate(ids, 1)[0, -1].item()
    ours = list(lm.stream(ids, 12, eos, min_new_tokens=min_new))
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=12, min_new_tokens=min_new, eos_token_id=eos,
                             pad_token_id=0, do_sample=False)[0, 6:].tolist()
    assert ours == ref and eos not in ours[:min_new]
    assert (ours == [eos]) == (min_new == 0)


def test_bad_input_is_a_clear_error_before_work(llama_lm):
    _, lm = llama_lm
    with pytest.raises(ValueError, match="max_seq_len"):
        lm.generate(torch.zeros((1, 40), dtype=torch.long), 9)
    with pytest.raises(ValueError, match="batch 1"):
        lm.generate(torch.zeros((2, 4), dtype=torch.long), 3)
    with pytest.raises(ValueError, match="token ids"):
        lm.generate(torch.full((1, 4), 97, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="top_p"):
        lm.generate(torch.zeros((1, 4), dtype=torch.long), 3, do_sample=True, top_p=0.0)
    with pytest.raises(UnsupportedError, match="causal LM"):
        llm.compile(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match="'int8'"):
        llm.compile(_llama(), weights="int3")


def _family(name):
    small = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=89,
                 max_position_embeddings=128)
    if name == "gpt2":
        return _gpt2()
    cfg_cls, model_cls = {
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "olmo": (transformers.OlmoConfig, transformers.OlmoForCausalLM),
        "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM),
        "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
    }[name]
    torch.manual_seed(2)
    extra = {"sliding_window": None} if name in ("mistral", "qwen2", "mixtral") else {}
    if name == "mixtral":  # 8 experts, top-2
        extra.update(num_local_experts=8, num_experts_per_tok=2)
    if name == "qwen2_moe":  # small experts, top-4 renormalised, a gated shared expert
        extra.update(num_experts=8, num_experts_per_tok=4, moe_intermediate_size=32,
                     shared_expert_intermediate_size=80, norm_topk_prob=True)
    if name in ("phi3", "olmo", "olmo2", "gemma", "gemma2"):
        extra["pad_token_id"] = 0
    if name.startswith("gemma"):
        extra["head_dim"] = 24  # not a multiple of the vector width
    model = model_cls(cfg_cls(**small, **extra)).eval()
    with torch.no_grad():  # larger weights: logits far from flat, greedy ties unlikely
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
    return model


@pytest.mark.parametrize("family", ["gpt2", "mistral", "qwen2", "qwen3", "phi3", "olmo",
                                    "olmo2", "gemma", "mixtral", "qwen2_moe"])
def test_family_greedy_tokens_match_hf(family):
    """64 new tokens, each the argmax of HF's forward in float64 over the prefix before it
    (teacher-forced on roller's own output: every step checked, no drift of one generation
    against another; tiny random configs, weights enlarged so the choices are not ties)."""
    import copy

    model = _family(family)
    lm = llm.compile(model, max_seq_len=72, cache=False)
    # no roller error in any kernel (a symbolic topk once failed to specialise its buffers)
    assert not [e["name"] for e in lm.report if e.get("fallback") == "error"]
    ids = torch.randint(0, 89, (1, 6), generator=torch.Generator().manual_seed(5))
    out = lm.generate(ids, 64)
    from harness.examples.hf_models import eager_experts

    ref = eager_experts(copy.deepcopy(model).double())
    with torch.no_grad():
        logits = ref(out).logits[0]
    assert out[0, 6:].tolist() == logits[5:-1].argmax(-1).tolist()


def test_soft_capped_attention_is_declined_with_its_reason():
    """Gemma 2 caps its attention logits (and slides a window): a decline naming it."""
    with pytest.raises(UnsupportedError, match="soft-capping|sliding"):
        llm.compile(_family("gemma2"), max_seq_len=72, cache=False)


def test_sampling_top_p_keeps_the_smallest_set_reaching_it():
    import numpy as np

    from tvm_roller.integrations.llm.sampling import Sampling, TokenPicker

    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    pick = TokenPicker(Sampling(do_sample=True, top_k=0, top_p=0.7, seed=0))
    drawn = {pick(logits) for _ in range(200)}
    assert drawn == {0, 1}  # 0.5 < 0.7 <= 0.8: the first two
    assert TokenPicker(Sampling())(logits) == 0


def test_cache_ops_eager_match_the_kernels():
    """The torch ops' own (eager) implementations agree with the compiled kernels' layout, for
    sequences whose blocks are scattered over the pool (tables not in order)."""
    import numpy as np
    import tvm

    from tvm_roller.backends.cpu.kv_cache import (CacheLayout, attention_kernel,
                                                  padded_length, write_kernel)
    from tvm_roller.backends.cpu.attention_plan import plan_tiles
    from tvm_roller.backends.cpu.kv_prompt_attention import prompt_attention_kernel
    from tvm_roller.integrations.llm import cache_ops

    tiles = plan_tiles(device_for(host_target()), 16, 70, 3)
    lay = CacheLayout(2, 2, 16, padded_length(70, tiles.block), 6, tiles.block)
    nb = lay.max_blocks
    pool = 3 * nb + 1
    # three sequences' tables: disjoint pool blocks in a shuffled order
    order = np.random.default_rng(3).permutation(pool)[:3 * nb].astype("int32")
    tables = torch.tensor(order.reshape(3, nb))
    lengths = torch.tensor([67, 5, 70], dtype=torch.int32)
    gen = torch.Generator().manual_seed(4)
    keys = torch.randn(lay.key_shape(pool), generator=gen)
    values = torch.randn(lay.value_shape(pool), generator=gen)

    def build(func):
        return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                           target=host_target())["main"]

    def t(x):
        return tvm.runtime.tensor(np.ascontiguousarray(x.numpy()))

    kc, vc, tb = t(keys), t(values), t(tables)
    # each sequence's prompt, one sequence at a time (a prompt's write is batch 1)
    for s in range(3):
        n = int(lengths[s])
        new = torch.randn(1, 2, n, 16, generator=gen)
        one, ln = tables[s:s + 1], lengths[s:s + 1]
        keys = cache_ops.kv_write(keys, new, one, ln, 1, True)
        values = cache_ops.kv_write(values, new, one, ln, 1, False)
        build(write_kernel(lay, 1, True))(kc, t(new), t(one), t(ln))
        build(write_kernel(lay, 1, False))(vc, t(new), t(one), t(ln))
    np.testing.assert_array_equal(kc.numpy(), keys.numpy())
    np.testing.assert_array_equal(vc.numpy(), values.numpy())
    # a decode step of the three at once
    q = torch.randn(3, 6, 1, 16, generator=gen)
    want = cache_ops.kv_attention(q, keys, values, tables, lengths, 1, 0.25)
    got = tvm.runtime.tensor(np.zeros((3, 1, 6, 16), "float32"))
    build(attention_kernel(lay, 1, 0.25, tiles))(t(q), kc, vc, tb, t(lengths), got)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    # the first sequence's 5 last positions, causal
    q = torch.randn(1, 6, 5, 16, generator=gen)
    want = cache_ops.kv_attention(q, keys, values, tables[:1], lengths[:1], 1, 0.25)
    got = tvm.runtime.tensor(np.zeros((1, 5, 6, 16), "float32"))
    build(prompt_attention_kernel(lay, 1, 0.25, tiles))(t(q), kc, vc, t(tables[:1]),
                                                        t(lengths[:1]), got)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
