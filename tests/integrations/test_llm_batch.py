"""Continuous batching over the paged cache: a sequence's greedy tokens are the same alone as
beside others of different lengths joining at different steps, blocks come back, and a pool
that runs out preempts (and recomputes) instead of failing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import tvm_roller.llm as llm  # noqa: E402
from tvm_roller.integrations.llm.batch import BatchGenerator  # noqa: E402

MAX_SEQ = 160  # several cache blocks a sequence (head_dim 64: 32 or 64 positions a block)
VOCAB = 101


def _greedy(row, generated):
    return int(np.argmax(row))


@pytest.fixture(scope="module")
def batched_lm():
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(hidden_size=128, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   vocab_size=VOCAB, max_position_embeddings=128)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    return model, llm.compile(model, max_seq_len=MAX_SEQ, max_batch=8, cache=False)


def _prompts(count, seed):
    rng = np.random.default_rng(seed)
    lengths = [1, 2, 3, 7, 13, 17, 29, 31, 41, 5, 11, 23, 37, 19, 2, 47][:count]
    return [rng.integers(0, VOCAB, n).tolist() for n in lengths]


def _run(gen, prompts, new, joins):
    """Drive ``gen``: sequence i joins at step ``joins[i]``; each stops after ``new[i]``
    tokens. Returns each sequence's tokens and the most run at once."""
    out = {i: [] for i in range(len(prompts))}
    step, widest = 0, 0
    while step <= max(joins) or len(gen):
        for i, at in enumerate(joins):
            if at == step:
                gen.add(i, prompts[i], _greedy, new[i])
        for key, token in gen.step():
            out[key].append(token)
            if len(out[key]) == new[key]:
                gen.finish(key)
        widest = max(widest, gen.stats.decode_rows)
        step += 1
    return out, widest


def _hf(model, prompt, new):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        # an explicit mask: HF would otherwise mask prompt tokens equal to pad_token_id
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_batched_greedy_equals_solo_greedy(batched_lm):
    """8 sequences of mixed lengths joining at different steps, with a prefill chunk smaller
    than the longer prompts (their prompts span steps while others decode): each one's tokens
    equal its tokens alone and HF's greedy generate."""
    model, lm = batched_lm
    prompts = _prompts(8, 1)
    new = [MAX_SEQ - len(p) for p in prompts]
    new = [min(n, 9 + 2 * i) for i, n in enumerate(new)]
    gen = BatchGenerator(lm, pool_blocks=64, prefill_chunk=16)
    together, widest = _run(gen, prompts, new, joins=[0, 0, 1, 2, 3, 5, 8, 13])
    assert widest >= 5  # they really ran side by side
    assert gen.free_blocks == 64 and not gen.running and not gen.waiting
    for i, prompt in enumerate(prompts):
        alone, _ = _run(BatchGenerator(lm, pool_blocks=64, prefill_chunk=16), [prompt],
                        [new[i]], [0])
        assert together[i] == alone[0], i
        assert together[i] == _hf(model, prompt, new[i]), i


def test_sixteen_beside_each_other_up_to_max_batch(batched_lm):
    """16 sequences queued at once on a max_batch 8 model: at most 8 decode together, the rest
    wait, every one's tokens are its solo tokens."""
    _, lm = batched_lm
    prompts = _prompts(16, 2)
    new = [6] * 16
    gen = BatchGenerator(lm, pool_blocks=64, prefill_chunk=32)
    together, widest = _run(gen, prompts, new, joins=[0] * 16)
    assert widest == 8
    for i, prompt in enumerate(prompts):
        alone, _ = _run(BatchGenerator(lm, pool_blocks=64), [prompt], [6], [0])
        assert together[i] == alone[0], i


def test_pool_exhaustion_preempts_and_recomputes(batched_lm):
    """A pool of just over one full sequence's blocks for 6 long sequences: sequences are
    preempted (blocks freed, prompt and tokens recomputed later) or wait; none fails, each one's
    tokens are its solo tokens, and every block returns."""
    model, lm = batched_lm
    blocks = lm.cache.max_blocks + 1
    prompts = _prompts(16, 3)[6:12]
    new = [MAX_SEQ - len(p) for p in prompts]
    gen = BatchGenerator(lm, pool_blocks=blocks, prefill_chunk=16)
    preempted = 0
    out = {i: [] for i in range(len(prompts))}
    for i, p in enumerate(prompts):
        gen.add(i, p, _greedy, new[i])
    while len(gen):
        for key, token in gen.step():
            out[key].append(token)
            if len(out[key]) == new[key]:
                gen.finish(key)
        preempted += gen.stats.preempted
        assert gen.free_blocks >= 0
    assert gen.free_blocks == blocks
    if lm.cache.block < MAX_SEQ // 2:
        assert preempted > 0  # several blocks a sequence: they had to give way
    for i, prompt in enumerate(prompts):
        assert out[i] == _hf(model, prompt, new[i]), i


def test_finish_returns_blocks_and_bad_input_is_refused(batched_lm):
    _, lm = batched_lm
    gen = BatchGenerator(lm, pool_blocks=32)
    gen.add("a", list(range(30)), _greedy, 4)
    gen.add("b", [5, 6], _greedy, 4)
    gen.step()
    assert gen.free_blocks < 32
    gen.finish("a")
    gen.finish("b")
    assert gen.free_blocks == 32 and len(gen) == 0
    with pytest.raises(ValueError, match="max_seq_len"):
        gen.add("c", [1] * 150, _greedy, 11)
    with pytest.raises(ValueError, match="token ids"):
        gen.add("c", [VOCAB], _greedy, 1)
    with pytest.raises(ValueError, match="at least 1 token"):
        gen.add("c", [], _greedy, 1)
    with pytest.raises(ValueError, match="max_batch"):
        BatchGenerator(lm, pool_blocks=32, max_batch=9)
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        BatchGenerator(lm, pool_blocks=lm.cache.max_blocks - 1)
