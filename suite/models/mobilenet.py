"""MobileNetV2 from torchvision, adapted to 32x32 images (CIFAR-style).

torchvision's network downsamples 32x: a 32x32 image would be 1x1 after the third stage. As in
the usual CIFAR versions, the first conv has stride 1 (not 2) and the second stage of inverted
residual blocks (24 channels) stride 1 (not 2), so the last feature map is 4x4. Everything
else is torchvision's: its inverted residual blocks, ``width`` (torchvision's ``width_mult``:
channels scaled and rounded to multiples of 8; the last 1x1 conv keeps 1280 channels for
width <= 1), its initialisation and its dropout before the classifier (``dropout``, 0.2 as in
torchvision; set 0 for data-parallel runs that are to match ``single`` step for step, since each
rank draws its own dropout masks).

Top-level children: the 19 feature blocks (stem conv, 17 inverted residual blocks, last 1x1
conv) and the head (global average pool, dropout, linear), so pipeline and layer_split can cut
between blocks.
"""
from typing import ClassVar, Literal

from pydantic import PositiveFloat, confloat
from torch import nn

from suite.models.base import ModelOptions

# torchvision's inverted residual setting (expansion t, channels c, blocks n, stride s) with the
# second stage's stride 2 -> 1 for 32x32 inputs.
CIFAR_SETTING = [[1, 16, 1, 1], [6, 24, 2, 1], [6, 32, 3, 2], [6, 64, 4, 2],
                 [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]


class MobileNetV2(ModelOptions):
    name: Literal["mobilenet_v2"] = "mobilenet_v2"
    inputs: ClassVar = "images"
    width: PositiveFloat = 1.0
    dropout: confloat(ge=0, lt=1) = 0.2


OPTIONS = [MobileNetV2]


def build(spec, *, width: float, dropout: float) -> nn.Sequential:
    from torchvision.models.mobilenetv2 import MobileNetV2 as TorchvisionMobileNetV2
    from torchvision.ops.misc import Conv2dNormActivation

    net = TorchvisionMobileNetV2(num_classes=spec.num_classes, width_mult=width,
                                 inverted_residual_setting=CIFAR_SETTING, dropout=dropout)
    features = list(net.features)
    stem_channels = features[0][0].out_channels
    features[0] = Conv2dNormActivation(spec.input_shape[0], stem_channels, stride=1,
                                       norm_layer=nn.BatchNorm2d, activation_layer=nn.ReLU6)
    nn.init.kaiming_normal_(features[0][0].weight, mode="fan_out")  # as torchvision initialises convs
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), *net.classifier)
    return nn.Sequential(*features, head)
