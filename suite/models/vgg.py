"""VGG11 from torchvision's layer config, with a classifier sized for small images.

torchvision's own head (25088 -> 4096 -> 4096) assumes 224x224 ImageNet inputs and holds
120M parameters; CIFAR-style studies pool to 1x1 and use a small head, as here.
``width`` scales every conv layer's channels (0.25 gives a CPU-sized model).
"""
from typing import ClassVar, Literal

from pydantic import PositiveFloat, PositiveInt
from torch import nn

from suite.common.errors import SuiteError
from suite.models.base import ModelOptions


class VGG11(ModelOptions):
    name: Literal["vgg11"] = "vgg11"
    inputs: ClassVar = "images"
    width: PositiveFloat = 1.0
    batch_norm: bool = False
    classifier_hidden: PositiveInt = 512


OPTIONS = [VGG11]


def build(spec, *, width: float, batch_norm: bool, classifier_hidden: int) -> nn.Sequential:
    from torchvision.models.vgg import cfgs, make_layers

    channels, height, side = spec.input_shape
    if min(height, side) < 32:
        raise SuiteError(f"model vgg11 needs images of at least 32x32 (it pools 5 times); data "
                         f"{spec.name} gives {height}x{side}. Use cifar10/cifar100 or synthetic with shape [3, 32, 32]")
    cfg = [v if v == "M" else max(1, int(v * width)) for v in cfgs["A"]]
    features = make_layers(cfg, batch_norm=batch_norm)
    if channels != 3:
        first = features[0]
        features[0] = nn.Conv2d(channels, first.out_channels, 3, padding=1)
    # Keep conv blocks (conv, [bn], relu, [pool]) as top-level children so pipelines can split them.
    blocks, current = [], []
    for layer in features:
        current.append(layer)
        if isinstance(layer, nn.MaxPool2d):
            blocks.append(nn.Sequential(*current))
            current = []
    last = cfg[-2]
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(last, classifier_hidden), nn.ReLU(),
                         nn.Linear(classifier_hidden, spec.num_classes))
    return nn.Sequential(*blocks, head)
