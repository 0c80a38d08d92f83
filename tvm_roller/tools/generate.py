"""What ``tvm-roller generate`` runs: a causal LM (a named configuration with random weights,
or a local HuggingFace directory) compiled by ``tvm_roller.llm``, a prompt of token ids, new
tokens streamed under a progress bar, then prefill and decode tokens per second; or, for a
model directory, a text prompt (``--prompt``, ``--chat``) and the text printed as it streams."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, TextIO


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
             progress: bool = True, cache: bool = True, weights: str = "fp32",
             **sampling) -> GenerateResult:
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
    lm = llm.compile(model, max_seq_len=max_seq_len or len(prompt) + new_tokens, cache=cache,
                     weights=weights)
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


def generate_text(path: str, prompt: str, chat: bool = False, new_tokens: int = 32,
                  max_seq_len: Optional[int] = None, weights: str = "fp32", seed: int = 0,
                  cache: bool = True, stop: Sequence[str] = (), out: TextIO = sys.stdout,
                  **sampling) -> str:
    """Compile the model directory ``path`` with its tokenizer, write the text after
    ``prompt`` (``chat``: one user message through the chat template) to ``out`` as it
    streams, then a line of compile time and prefill / decode speeds. The generated text."""
    import os

    from tvm_roller.integrations import llm

    if not os.path.isdir(path):
        raise ValueError(f"--prompt needs a model directory with a tokenizer, got {path!r}")
    t0 = time.perf_counter()
    lm = llm.load(path, max_seq_len=max_seq_len, weights=weights, cache=cache)
    compile_s = time.perf_counter() - t0
    text = [{"role": "user", "content": prompt}] if chat else prompt
    stream = lm.stream_text(text, new_tokens, stop=stop, seed=seed, **sampling)
    for chunk in stream:
        out.write(chunk.text)
        out.flush()
    s = lm.stats
    out.write(f"\n\n[{os.path.basename(os.path.normpath(path))}: compile {compile_s:.1f} s; "
              f"prompt {stream.prompt_tokens} tokens, prefill {s.prefill_tok_s:.1f} tok/s; "
              f"{len(stream.token_ids)} new tokens ({stream.finish_reason}), decode "
              f"{s.decode_tok_s:.2f} tok/s]\n")
    return stream.text
