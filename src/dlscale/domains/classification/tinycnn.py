"""dlscale's own tiny CNN: a few milliseconds a step, for tests and quick runs."""

from __future__ import annotations

from dlscale.domains.classification.workload import ImageClassifier
from dlscale.workloads.base import register


def build_tinycnn(num_classes: int):
    import torch.nn as nn

    def block(cin: int, cout: int) -> list:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, 16), nn.MaxPool2d(2),
        *block(16, 32), nn.MaxPool2d(2),
        *block(32, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes),
    )


register(ImageClassifier("tinycnn", build_tinycnn, "dlscale", 32, 8,
                  "three conv-BN-ReLU blocks and a linear head, 24K parameters", num_classes=10))
