"""llama.cpp as a peer for python/bench_llm.py: the same HF weights written as a GGUF file
(``gguf``), run through ``llama-cpp-python`` on the same 2 threads.

Random-weight models have no tokenizer, so the file carries a placeholder vocabulary of the
model's size (byte tokens and fillers); prompts go in as token ids. Llama-family layouts
(Llama, Mistral: q/k rows reordered for llama.cpp's rotary convention; Qwen2: as HF holds them,
with the q/k/v biases; Mixtral: a Llama whose MLP is stacked experts, written as llama.cpp's
``ffn_gate_inp`` router and ``ffn_{gate,up,down}_exps`` tensors, HF's fused gate-up split). ``weights``: "f32" (what roller's fp32 path is compared with; greedy
tokens = HF's for Llama and Qwen2), "q8_0", "q4_0" (``gguf``'s quantization of the 2-D weights,
norms and biases kept in f32). llama.cpp 0.3.36 built here (its CPU backend reports AMX_INT8
and weight repacking) segfaults in ``llama_decode`` on quantized files — even a 2-layer model's —
unless its extra buffer types (the repacked weight layouts) are off: quantized files run with
``use_extra_bufts`` false, so their figures are llama.cpp without its repacked kernels.

    pip install llama-cpp-python gguf
"""
from __future__ import annotations

import time
from typing import List, Tuple

import numpy as np

ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "mixtral": "llama"}
FILE_TYPES = {"f32": 0, "q4_0": 2, "q8_0": 7}


def _rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half rows of each head as llama.cpp's "llama" rope reads them (pairs
    interleaved): per head, the first and second halves' rows alternate."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocab(writer, n: int) -> None:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    tokens += [f"t{i}" for i in range(len(tokens), n)]
    types += [1] * (n - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens[:n])
    writer.add_token_scores([0.0] * n)
    writer.add_token_types(types[:n])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)


def _tensor(writer, name: str, w: np.ndarray, weights: str) -> None:
    import gguf

    w = np.ascontiguousarray(w, dtype=np.float32)
    if weights == "f32" or w.ndim == 1:
        writer.add_tensor(name, w)
        return
    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_0": gguf.GGMLQuantizationType.Q4_0}[weights]
    packed = gguf.quants.quantize(w, qtype)  # bytes: [rows, blocks x block size]
    writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=qtype)


def write_gguf(model, path: str, weights: str = "f32") -> None:
    """``model`` (a Llama / Mistral / Qwen2 ``*ForCausalLM``) as a GGUF file at ``path``."""
    import gguf

    cfg = model.config
    if cfg.model_type not in ARCHS:
        raise ValueError(f"no GGUF layout here for {cfg.model_type}")
    arch = ARCHS[cfg.model_type]
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(getattr(cfg, "rope_theta", None)
                              or cfg.rope_parameters["rope_theta"])
    writer.add_file_type(FILE_TYPES[weights])
    experts = getattr(cfg, "num_local_experts", None)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
    _vocab(writer, cfg.vocab_size)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    _tensor(writer, "token_embd.weight", sd["model.embed_tokens.weight"], weights)
    _tensor(writer, "output_norm.weight", sd["model.norm.weight"], weights)
    if not cfg.tie_word_embeddings:
        _tensor(writer, "output.weight", sd["lm_head.weight"], weights)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{i}.{hf}.{kind}"
                if key not in sd:
                    continue
                w = sd[key]
                if arch == "llama" and gg in ("attn_q", "attn_k"):
                    w = _rotary_rows(w, heads if gg == "attn_q" else kv)
                _tensor(writer, f"blk.{i}.{gg}.{kind}", w, weights)
        if experts:
            _experts(writer, sd, i, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _experts(writer, sd: dict, layer: int, weights: str) -> None:
    """Layer ``layer``'s router and stacked experts in llama.cpp's names (numpy shapes
    ``[experts, rows, k]``; HF's ``gate_up_proj`` holds the gate's rows, then the up's)."""
    mlp = f"model.layers.{layer}.mlp"
    gate_up = sd[f"{mlp}.experts.gate_up_proj"]
    half = gate_up.shape[1] // 2
    _tensor(writer, f"blk.{layer}.ffn_gate_inp.weight", sd[f"{mlp}.gate.weight"], "f32")
    _tensor(writer, f"blk.{layer}.ffn_gate_exps.weight", gate_up[:, :half], weights)
    _tensor(writer, f"blk.{layer}.ffn_up_exps.weight", gate_up[:, half:], weights)
    _tensor(writer, f"blk.{layer}.ffn_down_exps.weight", sd[f"{mlp}.experts.down_proj"],
            weights)


def llamacpp_greedy(path: str, ids: List[int], new: int, threads: int = 2,
                    repack: bool = False) -> Tuple[float, float, List[int]]:
    """(prefill s, decode s per token, the prompt and its ``new`` greedy tokens) of llama.cpp
    on the GGUF file ``path``; ``repack``: a quantized file with llama.cpp's repacked weight
    layouts on (where they do not crash: see the module docstring)."""
    import llama_cpp

    if not path.endswith("-f32.gguf") and not repack:
        _without_weight_repacking(llama_cpp)
    lm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + new + 8, n_threads=threads,
               n_threads_batch=threads, n_batch=512, verbose=False)
    t0 = time.perf_counter()
    lm.eval(ids)
    prefill = time.perf_counter() - t0
    vocab = lm.n_vocab()

    def last() -> int:  # the last position's logits (the only ones llama.cpp computes)
        return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lm.ctx, -1),
                                                   shape=(vocab,))))

    out = list(ids) + [last()]
    t0 = time.perf_counter()
    for _ in range(new - 1):
        lm.eval([out[-1]])
        out.append(last())
    decode = (time.perf_counter() - t0) / max(new - 1, 1)
    lm.close()
    return prefill, decode, out


def _without_weight_repacking(llama_cpp) -> None:
    """The model parameters llama-cpp-python starts from, with ``use_extra_bufts`` off (its
    constructor takes no such argument; see the module docstring for why)."""
    default = llama_cpp.llama_cpp.llama_model_default_params
    if getattr(default, "roller_no_repack", False):
        return

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    params.roller_no_repack = True
    llama_cpp.llama_cpp.llama_model_default_params = params
