"""A HuggingFace model made ready for ``torch.export`` -> Relax: wrapped to take one tensor and
return one (:class:`LastHidden`), its batch norms given a trained model's statistics
(:func:`randomize_norm_statistics`). The builders by name (``models.hf_archs``, the
benchmarks' ``harness.examples.hf_models``) share them."""
from __future__ import annotations

import torch
from torch import nn


class LastHidden(nn.Module):
    """``model(**{arg: x}).last_hidden_state`` (else ``.logits``, else the first output): one
    tensor in, one out."""

    def __init__(self, model: nn.Module, arg: str):
        super().__init__()
        self.model = model
        self.arg = arg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(**{self.arg: x})
        for name in ("last_hidden_state", "logits"):
            value = getattr(out, name, None)
            if value is not None:
                return value
        return out[0]


def randomize_norm_statistics(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every batch norm random running statistics and affine parameters, as a trained
    model has: freshly initialised ones (mean 0, variance 1, weight 1 or even 0) make the
    normalisation an identity, or zero the output, and hide errors in how it is computed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.running_var is not None:
                c = mod.running_var.shape[0]
                mod.running_mean.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)
                mod.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                if mod.affine:
                    mod.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                    mod.bias.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)
    return model
