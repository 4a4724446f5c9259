"""A convolutional autoencoder: reconstruction loss (MSE against the input), no accuracy."""
from typing import ClassVar, Literal

from pydantic import PositiveInt
from torch import nn

from suite.common.errors import SuiteError
from suite.models.base import ModelOptions


class Autoencoder(ModelOptions):
    name: Literal["autoencoder"] = "autoencoder"
    inputs: ClassVar = "images"
    base_channels: PositiveInt = 16
    task: ClassVar = "reconstruction"


OPTIONS = [Autoencoder]


def build(spec, *, base_channels: int) -> nn.Sequential:
    channels, height, width = spec.input_shape
    if height % 4 or width % 4:
        raise SuiteError(f"model autoencoder needs image sides divisible by 4; data {spec.name} "
                         f"gives {height}x{width}")
    c = base_channels
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(channels, c, 3, stride=2, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.ReLU()),
        nn.Sequential(nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1), nn.ReLU()),
        nn.ConvTranspose2d(c, channels, 4, stride=2, padding=1))
