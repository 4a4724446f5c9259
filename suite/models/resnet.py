"""ResNet-18 from torchvision's blocks, adapted to 32x32 images (CIFAR-style).

torchvision's stem (7x7 stride-2 conv, then a stride-2 max-pool) is built for 224x224 ImageNet
inputs and would shrink a 32x32 image to 8x8 before the first residual block; CIFAR studies
use a 3x3 stride-1 conv and no max-pool instead, as here. The rest is torchvision's
``BasicBlock`` (two 3x3 convs with batch norm, 1x1 conv + BN on the shortcut where the shape
changes), stages of 2 blocks at 64/128/256/512 channels, and torchvision's initialisation.

Top-level children: the stem, each of the 8 ``BasicBlock``s, and the head (global average pool,
linear), so pipeline and layer_split can cut between residual blocks. ``width`` scales every
channel count (0.125 gives a CPU-sized model); at width 1 the layers are torchvision's resnet18
with the stem above.
"""
from typing import ClassVar, Literal

from pydantic import PositiveFloat
from torch import nn

from suite.models.base import ModelOptions

STAGES = [(64, 1), (128, 2), (256, 2), (512, 2)]  # (channels at width 1, stride of the first block)
BLOCKS_PER_STAGE = 2  # resnet18


class ResNet18(ModelOptions):
    name: Literal["resnet18"] = "resnet18"
    inputs: ClassVar = "images"
    width: PositiveFloat = 1.0


OPTIONS = [ResNet18]


def build(spec, *, width: float) -> nn.Sequential:
    from torchvision.models.resnet import BasicBlock, conv1x1, conv3x3

    channels = spec.input_shape[0]
    planes = [max(1, int(c * width)) for c, _ in STAGES]
    stem = nn.Sequential(conv3x3(channels, planes[0]), nn.BatchNorm2d(planes[0]), nn.ReLU(inplace=True))
    blocks, inplanes = [], planes[0]
    for out, (_, stride) in zip(planes, STAGES):
        for i in range(BLOCKS_PER_STAGE):
            s = stride if i == 0 else 1
            shortcut = None
            if s != 1 or inplanes != out:
                shortcut = nn.Sequential(conv1x1(inplanes, out, s), nn.BatchNorm2d(out))
            blocks.append(BasicBlock(inplanes, out, s, shortcut))
            inplanes = out
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inplanes, spec.num_classes))
    model = nn.Sequential(stem, *blocks, head)
    for m in model.modules():  # torchvision's ResNet initialisation
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)
    return model
