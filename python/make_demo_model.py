"""A local model directory for a fresh machine with no download: a small Llama (2 layers,
hidden 64) with seeded random weights and a byte-level BPE tokenizer trained here on generated
text, with bos / eos tokens and a chat template.

    python python/make_demo_model.py DIR          # then: tvm-roller serve DIR

``AutoTokenizer.from_pretrained(DIR)`` and ``AutoModelForCausalLM.from_pretrained(DIR)`` load it.
The same arguments make the same files (the corpus, the BPE training and the weights are
seeded), so the module cache compiles it once. The weights are random: the text it writes is
noise, made of the corpus's words and bytes.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Iterator, List

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
ROLES = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]  # the chat template's markers
# each message: its role marker, a newline, the content, <|end|>; the model's turn ends with
# <|end|> too, which is why generation_config lists it as a second eos token
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")

# multi-byte words (2-, 3- and 4-byte UTF-8) so the vocabulary holds partial characters and
# the streaming detokenizer has something to hold back
WORDS = ("the a of to and in is it that for on with as at by from compile kernel tensor "
         "schedule tile loop cache memory vector thread core model token prompt server "
         "request stream text byte rolled fast small layer weight decode prefill "
         "café naïve über façade Ωμέγα привет 日本語 東京 한국어 😀 🚀 ✓ →").split()


def corpus(seed: int, lines: int = 3000) -> Iterator[str]:
    """Generated sentences (seeded): words, digits and punctuation, some as chat turns."""
    rng = random.Random(seed)
    for i in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.2:
            words.append(str(rng.randint(0, 9999)))
        line = " ".join(words).capitalize() + rng.choice([".", "!", "?", ",", ":"])
        if i % 5 == 0:
            line = f"<|user|>\n{line}<|end|>\n<|assistant|>\n{line[::-1]}<|end|>\n"
        yield line


def train_tokenizer(seed: int, vocab_size: int):
    """A byte-level BPE (GPT-2's pre-tokenizer and decoder) trained on ``corpus(seed)``, which
    puts bos before each encoded text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials: List[str] = [BOS, EOS, PAD] + ROLES
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


def save_tokenizer(path: Path, seed: int = 0, vocab_size: int = 512, max_positions: int = 512,
                   pad_to: int = 0):
    """The trained tokenizer with its specials and chat template, saved to ``path``;
    ``pad_to``: filler tokens added up to that many ids (a larger model's vocabulary)."""
    import transformers

    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(seed, vocab_size), bos_token=BOS, eos_token=EOS,
        pad_token=PAD, additional_special_tokens=ROLES, chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False, model_max_length=max_positions)
    if pad_to > len(hf_tok):
        hf_tok.add_tokens([f"<filler_{i}>" for i in range(pad_to - len(hf_tok))])
    hf_tok.save_pretrained(path, save_jinja_files=False)  # the template in tokenizer_config
    return hf_tok


def make_demo_model(out: str, seed: int = 0, vocab_size: int = 512, hidden: int = 64,
                    layers: int = 2, max_positions: int = 512) -> Path:
    """Write the tokenizer, config, generation config and weights to ``out``."""
    import torch
    import transformers

    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    hf_tok = save_tokenizer(path, seed, vocab_size, max_positions)
    eos = [hf_tok.convert_tokens_to_ids(t) for t in (EOS, "<|end|>")]
    cfg = transformers.LlamaConfig(
        vocab_size=len(hf_tok), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_positions, bos_token_id=hf_tok.bos_token_id,
        eos_token_id=eos, pad_token_id=hf_tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=hf_tok.bos_token_id, eos_token_id=eos, pad_token_id=hf_tok.pad_token_id)
    model.save_pretrained(path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the directory to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0, help="corpus, tokenizer and weights seed")
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args(argv)
    path = make_demo_model(args.dir, args.seed, args.vocab_size, args.hidden, args.layers)
    print(f"wrote a demo Llama (random weights) and its tokenizer to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
