"""UNet (Ronneberger, Fischer and Brox, 2015): a contracting path of double 3x3 convolutions and
2x2 max-pools, an expanding path of 2x2 up-convolutions that halve the channels, each followed by
concatenation with the contracting path's feature map of the same level (the skip connection)
and a double 3x3 convolution, and a 1x1 convolution to class scores per pixel.

Faithful to the paper: 4 poolings (``depth``), 64 channels at the first level doubling per level
(``base_channels``; 8 gives a CPU-sized model), no batch norm (``batch_norm: true`` adds it after
every convolution, as many later UNets do). Two deliberate differences: convolutions are padded
(the paper's unpadded ones shrink 572x572 inputs to 388x388 maps and need overlap-tiling), so the
output is (batch, classes, H, W) for an input of H x W; and no dropout at the end of the contracting
path (dropout draws differ between ranks and the baseline, which a parity check cannot compare).

Not an ``nn.Sequential``: the skip connections feed each encoder level's output to the decoder,
so no cut between blocks carries what the later blocks need; the splitting strategies refuse it
(``not_splittable_because``). Its top-level children are still the coarse blocks (one per level)
that FSDP shards and activation checkpointing recomputes, each called once per forward.
"""
from typing import ClassVar, Literal

import torch
from pydantic import PositiveInt
from torch import nn

from suite.common.errors import SuiteError
from suite.models.base import ModelOptions


class UNet(ModelOptions):
    name: Literal["unet"] = "unet"
    task: ClassVar = "segmentation"
    inputs: ClassVar = "images"
    base_channels: PositiveInt = 64  # channels of the first level; doubled at each pooling
    depth: PositiveInt = 4  # poolings (the paper's 4); images must divide by 2**depth
    batch_norm: bool = False  # the paper has none


OPTIONS = [UNet]


def build(spec, *, base_channels: int, depth: int, batch_norm: bool) -> nn.Module:
    check_divisible("unet", spec, depth)
    return UNetModel(spec.input_shape[0], spec.num_classes, base_channels, depth, batch_norm)


def check_divisible(model: str, spec, depth: int) -> None:
    """Each pooling halves the image; decoders restore the size only if every halving is exact."""
    _, height, width = spec.input_shape
    step = 2 ** depth
    if height % step or width % step:
        raise SuiteError(f"model {model} with model.depth={depth} pools {depth} times, so images need sides "
                         f"divisible by {step}, but data {spec.name} gives {height}x{width}; resize the data "
                         f"(e.g. data.size) or lower model.depth")


def convs(widths: list[int], batch_norm: bool) -> list[nn.Module]:
    """3x3 padded convolutions widths[0] -> widths[1] -> ..., each followed by [batch norm and] ReLU."""
    layers = []
    for c_in, c_out in zip(widths, widths[1:]):
        layers.append(nn.Conv2d(c_in, c_out, 3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(c_out))
        layers.append(nn.ReLU(inplace=True))
    return layers


class Up(nn.Module):
    """2x2 up-convolution halving the channels, concatenation with the skip, double convolution."""

    def __init__(self, c_in: int, c_out: int, batch_norm: bool):
        super().__init__()
        self.up = nn.ConvTranspose2d(c_in, c_out, 2, stride=2)
        self.conv = nn.Sequential(*convs([2 * c_out, c_out, c_out], batch_norm))

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class EncoderDecoder(nn.Module):
    """What UNet and SegNet share: ``depth`` poolings down and as many stages back up, and a
    reason (``not_splittable_because``) the splitting strategies give when they refuse it."""
    not_splittable_because = ""

    def __init__(self, depth: int):
        super().__init__()
        self.depth = depth


class UNetModel(EncoderDecoder):
    not_splittable_because = ("its decoder concatenates each encoder level's feature maps (skip connections), "
                              "which a cut between blocks would not carry")

    def __init__(self, channels: int, classes: int, base: int, depth: int, batch_norm: bool):
        super().__init__(depth)
        widths = [base * 2 ** i for i in range(depth + 1)]
        # Top-level children in forward order: down0..down{depth} (the last is the bottleneck), up..., head.
        self.add_module("down0", nn.Sequential(*convs([channels, widths[0], widths[0]], batch_norm)))
        for i in range(1, depth + 1):
            self.add_module(f"down{i}", nn.Sequential(nn.MaxPool2d(2), *convs([widths[i - 1], widths[i], widths[i]], batch_norm)))
        for i in reversed(range(depth)):
            self.add_module(f"up{i}", Up(widths[i + 1], widths[i], batch_norm))
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x):
        skips = []
        for i in range(self.depth + 1):
            x = getattr(self, f"down{i}")(x)
            skips.append(x)
        skips.pop()  # the bottleneck's output is x itself
        for i in reversed(range(self.depth)):
            x = getattr(self, f"up{i}")(x, skips.pop())
        return self.head(x)
