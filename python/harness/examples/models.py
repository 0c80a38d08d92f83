"""Three PyTorch models that exercise the Relax pipeline end to end.

Each factory returns an ``nn.Module`` in eval mode with deterministic random weights; ``INPUT_SHAPES``
gives the input each is meant for. Use them as
``PYTHONPATH=python tvm-roller compile-model harness.examples.models:bert_layer --input-shape 1,128,768``.
"""
from __future__ import annotations

import torch
from torch import nn

INPUT_SHAPES = {
    "mlp": (32, 784),
    "bert_layer": (1, 128, 768),
    "resnet_cnn": (4, 3, 64, 64),
}


def mlp() -> nn.Module:
    """A 3-layer MLP: 784 -> 1024 -> 1024 -> 10 with ReLU."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10)).eval()


def bert_layer() -> nn.Module:
    """One BERT-base encoder layer (hidden 768, 12 heads, FFN 3072, GELU), batch-first."""
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu", batch_first=True).eval()


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv + BN, identity or 1x1-conv shortcut, ReLU."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.short is None else self.short(x)))


class ResNetCNN(nn.Module):
    """Stem conv + max-pool, three basic blocks (32, 64, 128 channels), global average pool, FC."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.blocks = nn.Sequential(BasicBlock(32, 32), BasicBlock(32, 64, 2), BasicBlock(64, 128, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def resnet_cnn() -> nn.Module:
    torch.manual_seed(0)
    model = ResNetCNN()
    # non-trivial BN statistics, so folding them is actually checked
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model.eval()
