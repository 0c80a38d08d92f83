"""``tvm-roller generate``: a named random-weight config compiled, greedy tokens printed with
the prefill and decode speeds; a bad name is a clear error (exit status 2)."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tvm_roller.tools.cli import main  # noqa: E402


def test_generate_tiny_prints_tokens_and_speeds(capsys):
    import torch

    from tvm_roller.tools.models.llm_configs import build

    assert main(["generate", "tiny", "--prompt-ids", "3,14,15,92,65", "--new-tokens", "6",
                 "--no-progress", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "prefill" in out and "decode" in out and "tok/s" in out
    model = build("tiny")[0]
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             pad_token_id=0)[0, 5:].tolist()
    assert f"new token ids: {ref}" in out


def test_generate_unknown_config_is_a_clear_error(capsys):
    assert main(["generate", "no-such-model", "--no-progress"]) == 2
    assert "unknown config" in capsys.readouterr().err
