"""A multi-layer perceptron on flattened inputs."""
from typing import Literal

import math
from torch import nn

from suite.models.base import ModelOptions


class MLP(ModelOptions):
    name: Literal["mlp"] = "mlp"
    hidden: list[int] = [256, 256]


OPTIONS = [MLP]


def build(opts: MLP, spec) -> nn.Sequential:
    width = math.prod(spec.input_shape)
    layers: list[nn.Module] = [nn.Flatten()]
    for h in opts.hidden:
        layers += [nn.Sequential(nn.Linear(width, h), nn.ReLU())]
        width = h
    layers.append(nn.Linear(width, spec.num_classes))
    return nn.Sequential(*layers)
