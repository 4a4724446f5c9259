"""The segmentation folder reader on tiny PNGs written here: both layouts, resize and crop, and
every bad layout as one line naming the key or the file and the layout expected."""
import numpy as np
import pytest
import torch
from PIL import Image

from suite.data import DATASETS
from suite.common.errors import SuiteError
from suite.submit import preflight
from tests.parity import make_recipe

Reader = DATASETS["segmentation_folder"]


def write_pair(folder, stem, mask: np.ndarray, image_size=None, mask_mode="L", suffix=".png"):
    """An RGB image and its mask of class ids (``mask``: height x width)."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "masks").mkdir(parents=True, exist_ok=True)
    h, w = image_size or mask.shape
    pixels = np.random.default_rng(len(stem)).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / "images" / f"{stem}{suffix}")
    Image.fromarray(mask.astype(np.uint8)).convert(mask_mode).save(folder / "masks" / f"{stem}.png")


def ids(h=6, w=8, classes=3):
    return np.arange(h * w).reshape(h, w) % classes


def test_train_and_val_folders(tmp_path):
    for i in range(3):
        write_pair(tmp_path / "train", f"t{i}", ids())
    write_pair(tmp_path / "val", "v0", ids(classes=4), suffix=".jpg")  # images may be JPEG; masks are PNG
    reader = Reader(root=str(tmp_path))
    reader.check_available()
    train, val = reader.load()
    assert len(train) == 3 and len(val) == 1 and reader.sizes() == (3, 1)
    assert train.tensors[0].shape == (3, 3, 6, 8) and train.tensors[0].dtype == torch.float32
    assert torch.equal(train.tensors[1][0], torch.from_numpy(ids()).long())
    spec = reader.spec()
    assert spec.input_shape == (3, 6, 8) and spec.num_classes == 4  # largest id in any mask + 1
    # Standardised with the training set's statistics.
    assert train.tensors[0].mean(dim=(0, 2, 3)).abs().max() < 1e-5


def test_one_folder_is_split_by_val_fraction_the_same_way_every_time(tmp_path):
    for i in range(10):
        write_pair(tmp_path, f"s{i}", np.full((4, 4), i % 2), mask_mode="P")  # palette masks: the indices
    train, val = Reader(root=str(tmp_path), val_fraction=0.3).load()
    again, _ = Reader(root=str(tmp_path), val_fraction=0.3).load()
    assert len(train) == 7 and len(val) == 3 and torch.equal(train.tensors[0], again.tensors[0])
    assert set(torch.cat([train.tensors[1], val.tensors[1]]).unique().tolist()) == {0, 1}


def test_resize_and_crop_to_a_fixed_size(tmp_path):
    write_pair(tmp_path / "train", "a", ids(6, 8))
    write_pair(tmp_path / "train", "b", ids(10, 12))  # another size: fine once data.size is set
    write_pair(tmp_path / "val", "c", ids(6, 8))
    train, _ = Reader(root=str(tmp_path), size=[4, 4]).load()
    assert train.tensors[0].shape == (2, 3, 4, 4) and set(train.tensors[1].unique().tolist()) <= {0, 1, 2}
    train, _ = Reader(root=str(tmp_path), size=[4, 6], fit="crop").load()
    assert torch.equal(train.tensors[1][0], torch.from_numpy(ids(6, 8)[1:5, 1:7]).long())  # the centre


def _error(tmp_path, **options) -> str:
    with pytest.raises(SuiteError) as err:
        Reader(root=str(tmp_path), **options).check_available()
    message = str(err.value)
    assert "\n" not in message
    return message


LAYOUT = "train/{images,masks}/ and "


def test_missing_folders_and_unpaired_files(tmp_path):
    assert "is not a folder" in _error(tmp_path / "nowhere") and LAYOUT in _error(tmp_path / "nowhere")
    (tmp_path / "other").mkdir()
    assert "holds neither train/ and val/ nor images/ and masks/" in _error(tmp_path)
    write_pair(tmp_path / "train", "a", ids())
    assert f"folder {tmp_path}/val/images is missing" in _error(tmp_path)
    write_pair(tmp_path / "val", "b", ids())
    (tmp_path / "val" / "masks" / "b.png").rename(tmp_path / "val" / "masks" / "x.png")
    message = _error(tmp_path)
    assert f"1 image(s) without a partner of the same stem in {tmp_path}/val/masks (first: b.png)" in message
    assert message.startswith(f"data.root='{tmp_path}'") and LAYOUT in message


@pytest.mark.parametrize("problem, options, fragment", [
    ("rgb mask", {}, "has mode RGB; masks must be single-channel PNGs of class ids"),
    ("mask size", {"size": [4, 4]}, "is 8x6 but its image a.png is 7x5 (width x height)"),
    ("id too large", {"classes": 2}, "data.classes=2, but mask"),
    ("sizes differ", {}, "data.size is not set, but the images differ in size"),
    ("crop too large", {"size": [9, 9], "fit": "crop"}, "data.size=[9, 9] with data.fit=crop needs images at least"),
    ("not an image", {}, "is not a readable image"),
])
def test_bad_files_are_one_line(tmp_path, problem, options, fragment):
    write_pair(tmp_path / "val", "v", ids())
    if problem == "rgb mask":
        write_pair(tmp_path / "train", "a", ids(), mask_mode="RGB")
    elif problem == "mask size":
        write_pair(tmp_path / "train", "a", ids(), image_size=(5, 7))
    elif problem == "sizes differ":
        write_pair(tmp_path / "train", "a", ids(4, 4))
    else:
        write_pair(tmp_path / "train", "a", ids())
    if problem == "not an image":
        (tmp_path / "train" / "images" / "a.png").write_bytes(b"not a png")
    assert fragment in _error(tmp_path, **options)


def test_a_bad_folder_is_refused_before_launch(tmp_path):
    with pytest.raises(SuiteError, match="data.root=.* is not a folder; expected"):
        recipe = make_recipe({"name": "ddp"}, 2, model={"name": "unet", "base_channels": 4, "depth": 1},
                             data={"name": "segmentation_folder", "root": str(tmp_path / "missing")})
        preflight.check([recipe], tmp_path / "runs", dry_run=True)


@pytest.mark.parametrize("model, data, fragment", [
    ({"name": "unet", "base_channels": 4, "depth": 1}, {"name": "digits"},
     "model.name=unet predicts a class per pixel, but data.name=digits gives one label per sample"),
    ({"name": "cnn"}, {"name": "shapes", "size": [32, 32]},
     "data.name=shapes gives a mask per image (a class id per pixel), but model.name=cnn predicts one"),
])
def test_masks_and_labels_must_fit_the_model_before_launch(tmp_path, model, data, fragment):
    with pytest.raises(SuiteError) as err:
        preflight.check([make_recipe({"name": "single"}, 1, model=model, data=data)], tmp_path, dry_run=True)
    assert fragment in str(err.value) and "\n" not in str(err.value)
