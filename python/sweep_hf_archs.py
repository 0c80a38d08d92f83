"""Many HuggingFace architectures, small configs with random weights, through
``tvm_roller.relax.compile`` (default settings): does each export, compile, match PyTorch, and
with how many roller errors / declines? Each architecture runs in a child process, so a crash
is counted, not fatal. Prints a markdown table.

    python python/sweep_hf_archs.py [--archs t5,distilbert,...] [--timeout 600]

The architectures are built with ``transformers.AutoModel.from_config`` from a small config
(2 layers, small hidden sizes); text models take 64 token ids, vision models a 64x64 image
(224 where the architecture needs it), audio models 4000 samples or an 80x200 log-mel input.
"""
from __future__ import annotations

import argparse
import json
import sys

_TEXT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
             vocab_size=1000)
# name -> (config class, config overrides, input kind)
ARCHS = {
    "t5": ("T5Config", dict(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128,
                            vocab_size=1000), "text-encoder"),
    "distilbert": ("DistilBertConfig", dict(n_layers=2, dim=64, n_heads=4, hidden_dim=128,
                                            vocab_size=1000), "text"),
    "roberta": ("RobertaConfig", dict(_TEXT, max_position_embeddings=130), "text"),
    "albert": ("AlbertConfig", dict(_TEXT, embedding_size=32), "text"),
    "electra": ("ElectraConfig", dict(_TEXT, embedding_size=32), "text"),
    "deberta_v2": ("DebertaV2Config", dict(_TEXT), "text"),
    "mpnet": ("MPNetConfig", dict(_TEXT), "text"),
    "llama": ("LlamaConfig", dict(_TEXT, num_key_value_heads=2, use_cache=False), "text"),
    "mistral": ("MistralConfig", dict(_TEXT, num_key_value_heads=2, use_cache=False), "text"),
    "qwen2": ("Qwen2Config", dict(_TEXT, num_key_value_heads=2, use_cache=False), "text"),
    "opt": ("OPTConfig", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                              ffn_dim=128, word_embed_proj_dim=64, vocab_size=1000,
                              use_cache=False), "text"),
    "bloom": ("BloomConfig", dict(n_layer=2, hidden_size=64, n_head=4, vocab_size=1000,
                                  use_cache=False), "text"),
    "gpt_neox": ("GPTNeoXConfig", dict(_TEXT, use_cache=False), "text"),
    "phi": ("PhiConfig", dict(_TEXT, use_cache=False), "text"),
    "convnext": ("ConvNextConfig", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
                 "image"),
    "convnextv2": ("ConvNextV2Config", dict(hidden_sizes=[16, 32, 64, 128],
                                            depths=[1, 1, 1, 1]), "image"),
    "swin": ("SwinConfig", dict(image_size=64, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                                window_size=4), "image"),
    "deit": ("DeiTConfig", dict(_TEXT, image_size=64, patch_size=8), "image"),
    "beit": ("BeitConfig", dict(_TEXT, image_size=64, patch_size=8), "image"),
    "clip_vision": ("CLIPVisionConfig", dict(_TEXT, image_size=64, patch_size=8), "image"),
    "segformer": ("SegformerConfig", dict(num_encoder_blocks=2, depths=[1, 1],
                                          sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                          num_attention_heads=[1, 2], decoder_hidden_size=32,
                                          patch_sizes=[7, 3], strides=[4, 2],
                                          mlp_ratios=[2, 2]), "image"),
    "regnet": ("RegNetConfig", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                    embedding_size=16, groups_width=8), "image"),
    "efficientnet": ("EfficientNetConfig", dict(width_coefficient=0.25, depth_coefficient=0.25,
                                                hidden_dim=320,
                                                image_size=64), "image"),
    "mobilevit": ("MobileViTConfig", dict(image_size=64, hidden_sizes=[16, 24, 32],
                                          neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64]),
                  "image"),
    "levit": ("LevitConfig", dict(image_size=224, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2],
                                  depths=[1, 1, 1], key_dim=[8, 8, 8]), "image224"),
    "poolformer": ("PoolFormerConfig", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
                   "image"),
    "wav2vec2": ("Wav2Vec2Config", dict(_TEXT, conv_dim=[32, 32, 32], conv_stride=[5, 2, 2],
                                        conv_kernel=[10, 3, 3], num_conv_pos_embeddings=16,
                                        num_conv_pos_embedding_groups=4), "audio"),
    "hubert": ("HubertConfig", dict(_TEXT, conv_dim=[32, 32, 32], conv_stride=[5, 2, 2],
                                    conv_kernel=[10, 3, 3], num_conv_pos_embeddings=16,
                                    num_conv_pos_embedding_groups=4), "audio"),
}


def run_one(arch: str) -> dict:
    import warnings

    import numpy as np
    import torch
    import transformers
    import tvm
    from tvm import relax

    import tvm_roller
    from tvm_roller.integrations.pytorch import import_torch
    from tvm_roller.tools.examples.hf_models import randomize_norm_statistics

    cls_name, overrides, kind = ARCHS[arch]
    torch.manual_seed(0)
    cfg = getattr(transformers, cls_name)(**overrides)
    cfg._attn_implementation = "eager"
    if kind == "text-encoder":
        from transformers import T5EncoderModel

        model = T5EncoderModel(cfg)
    else:
        model = transformers.AutoModel.from_config(cfg)
    randomize_norm_statistics(model)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    if kind.startswith("text"):
        x, arg = torch.randint(0, 1000, (1, 64), generator=gen), "input_ids"
    elif kind == "audio":
        x, arg = torch.randn(1, 4000, generator=gen), "input_values"
    else:
        size = 224 if kind == "image224" else 64
        x, arg = torch.randn(1, 3, size, size, generator=gen), "pixel_values"

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, inp):
            out = self.model(**{arg: inp})
            hidden = getattr(out, "last_hidden_state", None)
            return hidden if hidden is not None else out[0]

    wrapped = Wrapped().eval()
    row = {"arch": arch, "stage": "export"}
    mod = import_torch(wrapped, x)
    row["stage"] = "compile"
    report: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = tvm_roller.relax.compile(mod, tvm_roller.hardware.normalize_target("llvm"), report,
                                      cache=False)
    row["stage"] = "run"
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()))
    out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
    with torch.no_grad():
        ref = wrapped(x).numpy()
    if not np.abs(ref).max() > 1e-12:
        raise ValueError(f"{arch}: PyTorch's output is all zeros, nothing to compare")
    row.update(stage="done", rel_err=float(np.abs(out - ref).max() / np.abs(ref).max()),
               funcs=len(report), roller=sum(e["status"] == "roller" for e in report),
               declined=[f"{e['name']}: {e['reason'][:120]}" for e in report
                         if e["fallback"] == "decline"],
               errors=[f"{e['name']}: {e['reason'][:200]}" for e in report
                       if e["fallback"] == "error"])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.one:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(run_one(args.one), fh)
        return 0
    from tvm_roller.tools.bench.measure import run_isolated

    rows = []
    for arch in args.archs.split(","):
        run = run_isolated(__file__, ["--one", arch], fresh_cache=False, capture=True,
                           timeout=args.timeout)
        if run.row is not None:
            rows.append(run.row)
        elif run.status == "timeout":
            rows.append({"arch": arch, "stage": "timeout"})
        else:
            err = run.stderr.strip().splitlines()
            tail = [line for line in err if "Error" in line or "error" in line][-1:] or err[-1:]
            rows.append({"arch": arch, "stage": f"failed ({run.status})",
                         "message": tail[0][:200] if tail else ""})
        r = rows[-1]
        print(f"{arch}: {r['stage']} {r.get('rel_err', '')} {r.get('message', '')}",
              file=sys.stderr, flush=True)
    print("| arch | result | rel. err | roller / funcs | declined | errors |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["stage"] != "done":
            print(f"| {r['arch']} | {r['stage']}: {r.get('message', '')} | | | | |")
            continue
        print(f"| {r['arch']} | ok | {r['rel_err']:.1e} | {r['roller']} / {r['funcs']} "
              f"| {len(r['declined'])} | {len(r['errors'])} |")
    for r in rows:
        for what in ("declined", "errors"):
            for line in r.get(what, []):
                print(f"  {r['arch']} {what}: {line}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
