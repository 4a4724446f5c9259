"""A multi-layer perceptron on flattened inputs.

``dropout`` > 0 adds dropout after each hidden ReLU (the Keras-style MLP: flatten -> Dense 128
ReLU -> Dropout 0.2 -> Dense 10 is ``hidden: [128], dropout: 0.2``). Each data-parallel rank
draws its own dropout masks, so with dropout a data-parallel run does not repeat ``single``'s
steps exactly (one process, as layer_split, does).
"""
from typing import ClassVar, Literal

import math
from pydantic import PositiveInt, confloat
from torch import nn

from suite.models.base import ModelOptions


class MLP(ModelOptions):
    name: Literal["mlp"] = "mlp"
    inputs: ClassVar = "features"
    hidden: list[PositiveInt] = [256, 256]  # widths of the hidden layers; [] is a linear model
    dropout: confloat(ge=0, lt=1) = 0.0  # probability of zeroing a hidden unit, after each ReLU


OPTIONS = [MLP]


def build(spec, *, hidden: list[int], dropout: float = 0.0) -> nn.Sequential:
    width = math.prod(spec.input_shape)
    layers: list[nn.Module] = [nn.Flatten()]
    for h in hidden:
        # No Dropout module at 0: the model stays exactly what it was before the option existed.
        drop = [nn.Dropout(dropout)] if dropout else []
        layers += [nn.Sequential(nn.Linear(width, h), nn.ReLU(), *drop)]
        width = h
    layers.append(nn.Linear(width, spec.num_classes))
    return nn.Sequential(*layers)
