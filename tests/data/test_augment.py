"""Image augmentation and normalisation as data options: the crop and flip are what they say
(against a per-image reference), a sample's draw depends on (seed, epoch, index) only, so ddp
on 2 ranks trains on exactly single's inputs (losses within 1e-5), while the training inputs do
change; normalisation uses the data set's statistics or the recipe's; bad options are one line."""
import pytest
import torch
from torch.utils.data import TensorDataset

from suite.data import DATASETS
from suite.data.augment import Augment, AugmentedSet, crop_flip, draws
from tests.parity import BASE, FP32_TOLERANCE, assert_matches, make_recipe, step_losses
from tests.recipe.test_recipe_errors import assert_one_line, run_cli

# 2 epochs of 4 steps: the second epoch draws new crops and flips.
AUGMENTED = {**BASE["data"], "n_train": 128, "augment": {"crop_padding": 2, "hflip": True}}
TWO_EPOCHS = {**BASE["training"], "epochs": 2}


def reference(image, offset, flip, padding, fill):
    """One image, the obvious way: pad with the fill, slice, mirror."""
    c, h, w = image.shape
    padded = fill.view(c, 1, 1).repeat(1, h + 2 * padding, w + 2 * padding)
    padded[:, padding:padding + h, padding:padding + w] = image
    out = padded[:, offset[0]:offset[0] + h, offset[1]:offset[1] + w]
    return out.flip(-1) if flip else out


def test_crop_and_flip_equal_the_per_image_reference():
    x = torch.randn(64, 3, 6, 5)
    fill = torch.tensor([-1.0, 0.5, 2.0])
    offsets, flips = draws(64, 2, seed=0, epoch=0)
    assert flips.any() and not flips.all() and len(set(offsets.flatten().tolist())) == 5  # 0..4 all drawn
    out = crop_flip(x, offsets, flips, 2, fill)
    for i in range(64):
        assert torch.equal(out[i], reference(x[i], offsets[i], flips[i], 2, fill)), i


def _set(augment=None, n=40, seed=7):
    x = torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    epoch = {"now": 0}
    data = AugmentedSet(TensorDataset(x, torch.arange(n)), Augment(**(augment or {"crop_padding": 2, "hflip": True})),
                        seed, torch.zeros(3), epoch_of=lambda: epoch["now"])
    return data, x, epoch


def test_a_samples_augmentation_depends_on_seed_epoch_and_index_only():
    data, x, epoch = _set()
    whole, targets = data.__getitems__(list(range(40)))
    assert torch.equal(targets, torch.arange(40))
    # the same samples fetched in other batches, in another order (as another rank would): the same images
    odd, _ = data.__getitems__([39, 1, 17, 3])
    assert torch.equal(odd, whole[[39, 1, 17, 3]])
    assert torch.equal(data[17][0], whole[17])
    assert torch.equal(_set()[0].__getitems__(list(range(40)))[0], whole)  # a fresh set, same seed
    changed = (whole != x).flatten(1).any(1)
    assert changed.float().mean() > 0.8, "the augmentation must really change the inputs"
    epoch["now"] = 1
    assert not torch.equal(data.__getitems__(list(range(40)))[0], whole), "a new epoch draws anew"
    assert not torch.equal(_set(seed=8)[0].__getitems__(list(range(40)))[0], whole), "another seed draws anew"


def test_flip_alone_mirrors_about_half_and_keeps_the_rest():
    data, x, _ = _set({"hflip": True})
    out, _ = data.__getitems__(list(range(40)))
    mirrored = torch.tensor([torch.equal(o, i.flip(-1)) for o, i in zip(out, x)])
    kept = torch.tensor([torch.equal(o, i) for o, i in zip(out, x)])
    assert bool((mirrored ^ kept).all()) and 10 <= int(mirrored.sum()) <= 30


@pytest.fixture
def augmented_single(baseline_of):
    return baseline_of(make_recipe({"name": "single"}, data=AUGMENTED, training=TWO_EPOCHS)).losses


@pytest.mark.slow
def test_augmentation_changes_what_single_trains_on(augmented_single, tmp_path):
    plain = step_losses(make_recipe({"name": "single"}, data={**AUGMENTED, "augment": {}}, training=TWO_EPOCHS), tmp_path)
    assert max(abs(a - b) for a, b in zip(augmented_single, plain)) > 100 * FP32_TOLERANCE


@pytest.mark.slow
def test_ddp_with_augmentation_matches_single_process(augmented_single, tmp_path):
    recipe = make_recipe({"name": "ddp"}, world_size=2, data=AUGMENTED, training=TWO_EPOCHS)
    assert_matches(step_losses(recipe, tmp_path), augmented_single)


def test_normalize_true_uses_the_training_sets_statistics_for_synthetic_images():
    shape = {"name": "synthetic", "shape": [3, 8, 8], "n_train": 256, "n_val": 32}
    raw, raw_val = DATASETS["synthetic"](**shape).load()
    train, val = DATASETS["synthetic"](**shape, normalize=True).load()
    x = train.tensors[0]
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert torch.allclose(x.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-5)
    mean, std = raw.tensors[0].mean(dim=(0, 2, 3)), raw.tensors[0].std(dim=(0, 2, 3))
    assert torch.allclose(val.tensors[0], (raw_val.tensors[0] - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1))
    given, _ = DATASETS["synthetic"](**shape, normalize={"mean": [1, 2, 3], "std": [2, 2, 2]}).load()
    assert torch.allclose(given.tensors[0], (raw.tensors[0] - torch.tensor([1., 2, 3]).view(1, 3, 1, 1)) / 2)


def write_cifar10(root, per_file: int = 4):
    """CIFAR-10's python pickles, tiny: 5 training files and the test file of random pixels."""
    import pickle

    import numpy as np

    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        pixels = rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)
        (folder / f).write_bytes(pickle.dumps({"data": pixels, "labels": list(range(per_file))}))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))


def test_cifar_is_standardised_with_its_published_statistics_unless_told_otherwise(tmp_path):
    write_cifar10(tmp_path)
    pixels = DATASETS["cifar10"](root=str(tmp_path), normalize=False).load()[0].tensors[0]
    assert 0 <= pixels.min() and pixels.max() <= 1
    standard = DATASETS["cifar10"](root=str(tmp_path)).load()[0].tensors[0]
    mean, std = torch.tensor([0.4914, 0.4822, 0.4465]), torch.tensor([0.2470, 0.2435, 0.2616])
    assert torch.allclose(standard, (pixels - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1))
    # crop padding is a black pixel after normalisation, as torchvision's RandomCrop before Normalize
    opts = DATASETS["cifar10"](root=str(tmp_path), augment={"crop_padding": 4})
    train, _ = opts.load()
    sampler = torch.utils.data.DistributedSampler(train, num_replicas=1, rank=0, shuffle=False)
    batch, _ = next(iter(opts.train_loader(train, sampler, 20, seed=0)))
    corner = batch[:, :, 0, 0]  # offsets in 0..8: some crops start inside the padding
    black = -mean / std
    assert any(torch.allclose(c, black) for c in corner)


@pytest.mark.parametrize("args, expected", [
    (["data={name: synthetic, shape: [64], augment: {hflip: true}}"], "data.augment needs images of shape [channels, height, width]"),
    (["data={name: synthetic, shape: [1, 8, 8], augment: {crop_padding: 8}}"], "data.augment.crop_padding=8 must be smaller than the image (8x8)"),
    (["data={name: synthetic, shape: [1, 8, 8], augment: {flip: true}}"], "unknown recipe key data.augment.flip; accepted here: crop_padding, hflip"),
    (["data={name: synthetic, shape: [3, 8, 8], normalize: {mean: [0.5, 0.5]}}"], "data.normalize needs both mean and std"),
    (["data={name: synthetic, shape: [3, 8, 8], normalize: {mean: [0.5, 0.5], std: [1, 1]}}"],
     "data.normalize.mean=[0.5, 0.5] needs one number per channel: data synthetic has 3 channel(s)"),
    (["data={name: synthetic, shape: [3, 8, 8], normalize: yes please}"], "data.normalize='yes please': give true, false or"),
    (["data={name: synthetic, shape: [3, 8, 8], normalize: {std: [0, 1, 1], mean: [0, 0, 0]}}"], "data.normalize.std.0=0"),
])
def test_bad_data_options_are_one_line(capsys, args, expected):
    code, err = run_cli(capsys, *args)
    assert_one_line(code, err)
    assert expected in err, err
