"""What ``tvm-roller generate`` runs: a causal LM (a named configuration with random weights,
or a local HuggingFace directory) compiled by ``tvm_roller.llm``, a prompt of token ids, new
tokens streamed under a progress bar, then prefill and decode tokens per second."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional


@dataclass
class GenerateResult:
    """One generation: the new token ids and the speeds ``CausalLM.stats`` measured."""

    model: str
    prompt_tokens: int
    new_tokens: List[int]
    compile_s: float
    prefill_tok_s: float
    decode_tok_s: float


def load_causal_lm(name: str):
    """A named configuration (``tools.models.llm_configs``) or a local HF directory."""
    import os

    if os.path.isdir(name):
        import transformers

        return transformers.AutoModelForCausalLM.from_pretrained(name).eval()
    from tvm_roller.tools.models.llm_configs import build

    return build(name)[0]


def generate(name: str, prompt: Optional[List[int]] = None, prompt_len: int = 16,
             new_tokens: int = 32, max_seq_len: Optional[int] = None, seed: int = 0,
             progress: bool = True, cache: bool = True, **sampling) -> GenerateResult:
    """Compile ``name`` and generate ``new_tokens`` after ``prompt`` (token ids; default:
    ``prompt_len`` random ones drawn with ``seed``, which also seeds ``sampling``: the
    keywords of ``CausalLM.generate``)."""
    import torch

    from tvm_roller.integrations import llm

    model = load_causal_lm(name)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if prompt is None:
        prompt = torch.randint(0, vocab, (prompt_len,),
                               generator=torch.Generator().manual_seed(seed)).tolist()
    ids = torch.tensor([prompt], dtype=torch.long)
    t0 = time.perf_counter()
    lm = llm.compile(model, max_seq_len=max_seq_len or len(prompt) + new_tokens, cache=cache)
    compile_s = time.perf_counter() - t0
    tokens = lm.stream(ids, new_tokens, seed=seed, **sampling)
    if progress:
        from tqdm import tqdm

        tokens = tqdm(tokens, total=new_tokens, unit="tok", desc="generate")
    out = list(tokens)
    return GenerateResult(name, len(prompt), out, compile_s, lm.stats.prefill_tok_s,
                          lm.stats.decode_tok_s)


def format_result(r: GenerateResult) -> str:
    return (f"{r.model}: compile {r.compile_s:.1f} s; prompt {r.prompt_tokens} tokens, prefill "
            f"{r.prefill_tok_s:.1f} tok/s; {len(r.new_tokens)} new tokens, decode "
            f"{r.decode_tok_s:.2f} tok/s\nnew token ids: {r.new_tokens}")
