"""The small CNN of PyTorch's classic CIFAR-10 tutorial (two conv layers, three linear)."""
from typing import ClassVar, Literal

import torch
from torch import nn

from suite.common.errors import SuiteError
from suite.models.base import ModelOptions


class CNN(ModelOptions):
    name: Literal["cnn"] = "cnn"
    inputs: ClassVar = "images"


OPTIONS = [CNN]


def build(spec) -> nn.Sequential:
    channels, height, width = spec.input_shape
    if min(height, width) < 16:
        raise SuiteError(f"model cnn needs images of at least 16x16; data {spec.name} gives "
                         f"{height}x{width}. Use mnist, cifar10 or synthetic with a larger shape")
    features = nn.Sequential(
        nn.Conv2d(channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
    with torch.no_grad():
        flat = features(torch.zeros(1, *spec.input_shape)).shape[1]
    return nn.Sequential(
        features,
        nn.Sequential(nn.Linear(flat, 120), nn.ReLU()),
        nn.Sequential(nn.Linear(120, 84), nn.ReLU()),
        nn.Linear(84, spec.num_classes))
