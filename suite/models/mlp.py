"""A multi-layer perceptron on flattened inputs."""
from typing import ClassVar, Literal

import math
from pydantic import PositiveInt
from torch import nn

from suite.models.base import ModelOptions


class MLP(ModelOptions):
    name: Literal["mlp"] = "mlp"
    inputs: ClassVar = "features"
    hidden: list[PositiveInt] = [256, 256]  # widths of the hidden layers; [] is a linear model


OPTIONS = [MLP]


def build(spec, *, hidden: list[int]) -> nn.Sequential:
    width = math.prod(spec.input_shape)
    layers: list[nn.Module] = [nn.Flatten()]
    for h in hidden:
        layers += [nn.Sequential(nn.Linear(width, h), nn.ReLU())]
        width = h
    layers.append(nn.Linear(width, spec.num_classes))
    return nn.Sequential(*layers)
