"""The LLM text layer without a compile: the incremental detokenizer never splits a UTF-8
character and its deltas join to the full decode; stop strings cut the text and never leak a
stop string's start; ``TextStream`` ends on eos, a stop string or ``max_tokens`` and stops the
token stream; the demo directory's tokenizer and chat template."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tvm_roller.integrations.llm.detokenize import Detokenizer, StopStrings
from tvm_roller.integrations.llm.sampling import Sampling, TokenPicker
from tvm_roller.integrations.llm.text import TextStream, TextTokenizer


class ByteTokenizer:
    """Token i is byte i - 1; token 0 is a special token (eos) that decodes to nothing."""

    eos_token_id = 0
    chat_template = None

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i - 1 for i in ids if i > 0).decode("utf-8", errors="replace")


def _byte_ids(text: str):
    return [b + 1 for b in text.encode("utf-8")]


def _pieces(decode, ids):
    detok = Detokenizer(decode)
    pieces = [detok.push(t) for t in ids]
    return pieces, pieces + [detok.flush()]


def test_detokenizer_never_splits_a_character():
    decode = ByteTokenizer().decode
    text = "añ 日本語 😀 ok → ✓"
    pieces, joined = _pieces(decode, _byte_ids(text))
    assert "".join(joined) == text
    assert not any("\ufffd" in p for p in pieces)
    # a 4-byte character comes out whole, on its last byte, after three empty deltas
    at = pieces.index("😀")
    assert pieces[at - 4:at] == [" ", "", "", ""]


def test_detokenizer_deltas_join_to_the_full_decode_even_for_invalid_bytes():
    decode = ByteTokenizer().decode
    rng = random.Random(0)
    words = ["a", "é", "日", "😀", " "]
    for _ in range(300):
        ids = []
        for _ in range(rng.randint(1, 12)):
            ids += _byte_ids(rng.choice(words)) if rng.random() < 0.6 else [rng.randint(1, 256)]
        _, joined = _pieces(decode, ids)
        assert "".join(joined) == decode(ids), ids


def test_detokenizer_on_a_byte_level_bpe():
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from make_demo_model import BOS, EOS, train_tokenizer

    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(0, 300),
                                              bos_token=BOS, eos_token=EOS)
    text = "Tile 漢字 🎉 naïve café, 東京!"  # 漢字 and 🎉 are not in the corpus: bytes
    ids = hf(text)["input_ids"]
    decode = TextTokenizer.wrap(hf).decode
    pieces, joined = _pieces(decode, ids)
    assert "".join(joined) == hf.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("deltas,stops,out,stopped", [
    (["Hel", "lo Wo", "rld"], ["lo W"], "Hel", True),
    (["Hel", "lo", " there"], ["lo W"], "Hello there", False),  # held "lo", then released
    (["abc", "def"], ["cd", "b"], "a", True),  # the earliest stop string wins
    (["x<", "|e", "nd|>y"], ["<|end|>"], "x", True),
    (["one two"], [], "one two", False),
])
def test_stop_strings(deltas, stops, out, stopped):
    s, emitted, hit = StopStrings(stops), [], False
    for d in deltas:
        text, hit = s.feed(d)
        emitted.append(text)
        if hit:
            break
    if not hit:
        emitted.append(s.flush())
    assert "".join(emitted) == out and hit == stopped
    # nothing emitted before the stop decided starts a stop string it then matched
    assert all(not any(st in e for st in stops) for e in emitted)


def test_stop_strings_wait_for_min_tokens():
    s = StopStrings(["ab"])
    assert s.feed("xab", match=False) == ("xab", False)
    assert s.feed("cab") == ("c", True)


class _Tokens:
    """A token stream that records whether it was closed (the model asked for no more)."""

    def __init__(self, ids):
        self.ids, self.given, self.closed = list(ids), 0, False

    def __iter__(self):
        return self

    def __next__(self):
        if self.given == len(self.ids):
            raise StopIteration
        self.given += 1
        return self.ids[self.given - 1]

    def close(self):
        self.closed = True


def _stream(ids, max_tokens=50, **kw):
    tok = TextTokenizer.wrap(ByteTokenizer())
    tokens = _Tokens(ids)
    return TextStream(tokens, tok, 3, max_tokens, eos=tok.eos_token_ids, **kw), tokens


def test_text_stream_ends_on_eos_without_its_text():
    stream, tokens = _stream(_byte_ids("hi é") + [0] + _byte_ids("never"))
    result = stream.result()
    assert result.text == "hi é" and result.finish_reason == "stop"
    assert result.token_ids[-1] == 0 and tokens.closed and tokens.given == 6


def test_text_stream_ends_at_max_tokens_with_the_held_text():
    ids = _byte_ids("ab😀")[:4]  # the emoji's first byte only: U+FFFD at the end
    stream, _ = _stream(ids, max_tokens=3)
    chunks = list(stream)
    assert [c.finish_reason for c in chunks] == [None, None, "length"]
    assert stream.text == "ab\ufffd" and len(stream.token_ids) == 3


def test_text_stream_cuts_at_a_stop_string_and_stops_generating():
    stream, tokens = _stream(_byte_ids("one two three four"), stop=["thr"])
    result = stream.result()
    assert result.text == "one two " and result.finish_reason == "stop"
    assert tokens.closed and tokens.given == len("one two thr")
    late, _ = _stream(_byte_ids("ab cab ab"), stop=["ab"], min_tokens=3)
    assert late.result().text == "ab c"


def test_token_picker_never_picks_a_banned_token():
    logits = np.array([0.1, 3.0, 2.0, -1.0], dtype="float32")
    assert TokenPicker(Sampling())(logits) == 1
    assert TokenPicker(Sampling())(logits, banned=[1]) == 2
    pick = TokenPicker(Sampling(do_sample=True, top_k=0, seed=0))
    assert 1 not in {pick(logits, banned=[1]) for _ in range(200)}


def test_demo_tokenizer_and_chat_template(tmp_path):
    pytest.importorskip("transformers")
    from make_demo_model import make_demo_model

    path = make_demo_model(str(tmp_path / "demo"))
    tok = TextTokenizer.from_pretrained(path, eos_token_ids=[6])
    hf = tok.hf
    assert tok.eos_token_ids == {hf.eos_token_id, 6}
    assert hf.decode([hf.convert_tokens_to_ids("<|end|>")]) == "<|end|>"
    ids = tok.chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == hf.bos_token_id and ids.count(hf.bos_token_id) == 1
    assert hf.decode(ids) == "<|begin_of_text|><|user|>\nHi<|end|>\n<|assistant|>\n"
    assert tok.prompt_ids("Hi") == [hf.bos_token_id] + hf("Hi", add_special_tokens=False)[
        "input_ids"]
    assert tok.prompt_ids([5, 7]) == [5, 7]
    with pytest.raises(ValueError, match="integers"):
        tok.prompt_ids([5, "x"])
    with pytest.raises(ValueError, match="chat template"):
        TextTokenizer.wrap(ByteTokenizer()).chat([{"role": "user", "content": "Hi"}])
