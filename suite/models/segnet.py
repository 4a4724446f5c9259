"""SegNet (Badrinarayanan, Kendall and Cipolla, 2017): VGG16's 13 convolutions as the encoder, five
2x2 max-pools that remember where each maximum was (the pooling indices), and a mirrored decoder
that max-unpools with those indices (sparse maps, values put back where the maxima came from)
and convolves them dense again; every convolution but the classifier is followed by batch norm
and ReLU, as in the authors' Caffe model; the decoder's last convolution is the classifier, 3x3
to class scores per pixel, output (batch, classes, H, W).

Faithful defaults: 5 stages of 2, 2, 3, 3, 3 convolutions (``depth``: the first N of them), 64
channels doubling to 512 (``base_channels``; 4 or 8 gives a CPU-sized model), batch norm on
(``batch_norm``). The paper initialises the encoder from ImageNet-trained VGG16; here every
layer starts from torch's default initialisation (no weights can be downloaded).

Not an ``nn.Sequential``: each decoder stage needs the pooling indices of its encoder stage,
several blocks earlier (skip-like), which a cut between blocks would not carry; the splitting
strategies refuse it (``not_splittable_because``). Its top-level children are the coarse blocks
(one per stage, each called once per forward) that FSDP shards and checkpointing recomputes.
"""
from typing import ClassVar, Literal

from pydantic import PositiveInt, conint
from torch import nn

from suite.models.base import ModelOptions
from suite.models.unet import EncoderDecoder, check_divisible, convs

_CONVS = (2, 2, 3, 3, 3)  # VGG16's convolutions per stage
_WIDTH = (1, 2, 4, 8, 8)  # x base_channels: 64, 128, 256, 512, 512


class SegNet(ModelOptions):
    name: Literal["segnet"] = "segnet"
    task: ClassVar = "segmentation"
    inputs: ClassVar = "images"
    base_channels: PositiveInt = 64
    depth: conint(ge=1, le=5) = 5  # encoder stages (poolings); images must divide by 2**depth
    batch_norm: bool = True  # after every convolution but the classifier, as in the paper


OPTIONS = [SegNet]


def build(spec, *, base_channels: int, depth: int, batch_norm: bool) -> nn.Module:
    check_divisible("segnet", spec, depth)
    return SegNetModel(spec.input_shape[0], spec.num_classes, base_channels, depth, batch_norm)


class Encoder(nn.Module):
    def __init__(self, widths: list[int], batch_norm: bool):
        super().__init__()
        self.conv = nn.Sequential(*convs(widths, batch_norm))
        self.pool = nn.MaxPool2d(2, stride=2, return_indices=True)

    def forward(self, x):
        return self.pool(self.conv(x))  # (pooled, indices)


class Decoder(nn.Module):
    def __init__(self, widths: list[int], batch_norm: bool):
        super().__init__()
        self.unpool = nn.MaxUnpool2d(2, stride=2)
        self.conv = nn.Sequential(*convs(widths, batch_norm))

    def forward(self, x, indices):
        return self.conv(self.unpool(x, indices))


class SegNetModel(EncoderDecoder):
    not_splittable_because = ("each decoder stage max-unpools with the pooling indices of its encoder stage, "
                              "several blocks earlier (skip-like), which a cut between blocks would not carry")

    def __init__(self, channels: int, classes: int, base: int, depth: int, batch_norm: bool):
        super().__init__(depth)
        widths = [base * w for w in _WIDTH[:depth]]
        c_in = channels
        for i in range(depth):  # encoder: c_in -> w -> w (-> w)
            self.add_module(f"enc{i}", Encoder([c_in] + [widths[i]] * _CONVS[i], batch_norm))
            c_in = widths[i]
        for i in reversed(range(depth)):  # decoder mirrors: w -> w (-> w) -> the previous stage's width
            out = widths[i - 1] if i else widths[0]
            n = _CONVS[i] - (0 if i else 1)  # stage 0's last convolution is the classifier (head)
            self.add_module(f"dec{i}", Decoder([widths[i]] * n + [out], batch_norm))
        self.head = nn.Conv2d(widths[0], classes, 3, padding=1)

    def forward(self, x):
        indices = []
        for i in range(self.depth):
            x, where = getattr(self, f"enc{i}")(x)
            indices.append(where)
        for i in reversed(range(self.depth)):
            x = getattr(self, f"dec{i}")(x, indices.pop())
        return self.head(x)
