import pytest
import torch

from suite.data import DataSpec
from suite.common.errors import SuiteError
from suite.models import MODELS, build


@pytest.mark.parametrize("name, options", [("mlp", {}), ("mlp", {"dropout": 0.2}), ("cnn", {}), ("vgg11", {"width": 0.125}),
                                           ("resnet18", {"width": 0.125}), ("mobilenet_v2", {"width": 0.25}),
                                           ("autoencoder", {})])
def test_every_model_is_a_sequential_of_blocks_with_the_right_output(name, options):
    spec = DataSpec("synthetic", (3, 32, 32), 7)
    model = build(MODELS[name][0](**options), spec)
    out = model(torch.randn(2, 3, 32, 32))
    expected = (2, 3, 32, 32) if name == "autoencoder" else (2, 7)
    assert isinstance(model, torch.nn.Sequential) and len(model) >= 3 and out.shape == expected


def test_vgg11_refuses_images_it_would_pool_away():
    with pytest.raises(SuiteError, match="vgg11 needs images of at least 32x32"):
        build(MODELS["vgg11"][0](), DataSpec("digits", (1, 8, 8), 10))
