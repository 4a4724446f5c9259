"""Image segmentation data read from a folder of images and masks (PNG masks of class ids).

Layout (``data.root``), either split by the data set's authors:

    root/train/images/<stem>.png|.jpg|...   root/train/masks/<stem>.png
    root/val/images/<stem>...               root/val/masks/<stem>.png

or not split, in which case a seeded shuffle of the stems puts ``data.val_fraction`` of them in
the validation set (the same split on every call, rank and machine):

    root/images/<stem>...                   root/masks/<stem>.png

Each image has exactly one mask of the same file stem and the same size. A mask is a
single-channel PNG (mode L, I or P; for a palette image the palette indices) whose pixel values are
class ids 0..classes-1 (masks must be lossless: JPEG would change the ids). Images are read as RGB
(``data.channels: 3``) or grey (1), scaled to [0, 1] and standardised per channel with the training
set's mean and standard deviation.

``data.size: [H, W]`` brings every pair to one size, by ``data.fit``: ``resize`` (bilinear for the
image, nearest for the mask, so ids stay ids) or ``crop`` (the centre H x W; images must be at least
that large). Without it every image must already have the same size. ``data.classes`` defaults
to the largest id in the masks + 1.

The whole set is read and checked before launch (in the submitting process, once): a missing
folder, an image without its mask or a mask without its image, an unreadable file, a mask that is
not single-channel or not its image's size, an id beyond ``data.classes``, images of different sizes
without ``data.size``: each is one line naming the key or the file and the layout expected.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch
from pydantic import Field, PositiveInt, confloat
from torch.utils.data import TensorDataset
from typing_extensions import Annotated

from suite.data import DataSpec
from suite.data.base import LoadedOnce
from suite.common.errors import SuiteError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
LAYOUT = ("ROOT/train/{images,masks}/ and ROOT/val/{images,masks}/, or ROOT/images/ and ROOT/masks/, "
          "with one mask PNG of class ids per image, of the same file stem")


class SegmentationFolder(LoadedOnce):
    name: Literal["segmentation_folder"] = "segmentation_folder"
    root: str  # the folder holding train/ and val/, or images/ and masks/
    size: Optional[Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]] = None  # [height, width]
    fit: Literal["resize", "crop"] = "resize"  # how data.size is reached
    val_fraction: confloat(gt=0, lt=1) = 0.2  # only for root/images + root/masks (no train/ val/)
    classes: Optional[PositiveInt] = None  # default: largest id in the masks + 1
    channels: Literal[1, 3] = 3

    def check_available(self) -> None:
        self.loaded()  # reads and checks every file, once (the spec and sizes need them anyway)


OPTIONS = [SegmentationFolder]


def load(*, root: str, size, fit: str, val_fraction: float, classes, channels: int):
    splits = pairs(Path(root).expanduser(), root, val_fraction)
    if size is None:
        _check_same_size(splits)
    read = {split: [_pair(image, mask, fit, size, channels) for image, mask in items]
            for split, items in splits.items()}
    images = {s: torch.from_numpy(np.stack([i for i, _ in read[s]])).float().div_(255) for s in read}
    masks = {s: torch.from_numpy(np.stack([m for _, m in read[s]]).astype(np.int64)) for s in read}
    if images["train"].ndim == 3:  # grey: N, H, W -> N, 1, H, W
        images = {s: x.unsqueeze(1) for s, x in images.items()}
    else:  # N, H, W, C -> N, C, H, W
        images = {s: x.permute(0, 3, 1, 2).contiguous() for s, x in images.items()}
    largest = max(int(m.max()) for m in masks.values())
    classes = largest + 1 if classes is None else classes
    for split, m in masks.items():
        per_mask = m.flatten(1)
        bad = ((per_mask.max(1).values >= classes) | (per_mask.min(1).values < 0)).nonzero().flatten().tolist()
        if bad:
            ids = per_mask[bad[0]].unique().tolist()
            raise SuiteError(f"data.classes={classes}, but mask {splits[split][bad[0]][1]} holds class ids {ids}; "
                             f"ids must be 0..{classes - 1}: set data.classes to at least {largest + 1}, or fix the mask")
    mean = images["train"].mean(dim=(0, 2, 3), keepdim=True)
    std = images["train"].std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    train, val = (TensorDataset((images[s] - mean) / std, masks[s]) for s in ("train", "val"))
    return train, val, DataSpec("segmentation_folder", tuple(train.tensors[0].shape[1:]), classes)


def pairs(root: Path, shown: str, val_fraction: float) -> dict[str, list[tuple[Path, Path]]]:
    """{"train": [(image, mask), ...], "val": [...]} from either layout; SuiteError naming data.root otherwise."""
    if not root.is_dir():
        raise SuiteError(f"data.root={shown!r} is not a folder; expected {_layout(shown)}")
    if (root / "train").is_dir() or (root / "val").is_dir():
        return {split: _matched(root / split, shown) for split in ("train", "val")}
    if not (root / "images").is_dir() and not (root / "masks").is_dir():
        raise SuiteError(f"data.root={shown!r} holds neither train/ and val/ nor images/ and masks/; "
                         f"expected {_layout(shown)}")
    items = _matched(root, shown)
    if len(items) < 2:
        raise SuiteError(f"data.root={shown!r} holds {len(items)} image(s) in images/, too few to split into "
                         f"training and validation sets; add images, or split them into train/ and val/")
    random.Random(0).shuffle(items)  # seeded: the same split everywhere
    n_val = min(len(items) - 1, max(1, round(len(items) * val_fraction)))
    return {"train": sorted(items[n_val:]), "val": sorted(items[:n_val])}


def _layout(root: str) -> str:
    return LAYOUT.replace("ROOT", root.rstrip("/"))


def _matched(folder: Path, shown: str) -> list[tuple[Path, Path]]:
    images_dir, masks_dir = folder / "images", folder / "masks"
    for d in (images_dir, masks_dir):
        if not d.is_dir():
            raise SuiteError(f"data.root={shown!r}: folder {d} is missing; expected {_layout(shown)}")
    images = {p.stem: p for p in sorted(images_dir.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES}
    masks = {p.stem: p for p in sorted(masks_dir.iterdir()) if p.suffix.lower() == ".png"}
    if not images:
        raise SuiteError(f"data.root={shown!r}: {images_dir} holds no images ({', '.join(IMAGE_SUFFIXES)}); "
                         f"expected {_layout(shown)}")
    for what, have, lack, where in (("image", images, masks, masks_dir), ("mask", masks, images, images_dir)):
        alone = sorted(set(have) - set(lack))
        if alone:
            raise SuiteError(f"data.root={shown!r}: {len(alone)} {what}(s) without a partner of the same stem in "
                             f"{where} (first: {have[alone[0]].name}); expected {_layout(shown)}")
    return [(images[s], masks[s]) for s in sorted(images)]


def _open(path: Path, pixels: bool = True):
    """The image (decoded; with ``pixels=False`` only its header is read); SuiteError naming the file."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(path)
        if pixels:
            img.load()
        return img
    except (OSError, UnidentifiedImageError) as e:
        raise SuiteError(f"data file {path} is not a readable image ({' '.join(str(e).split())[:80]}); "
                         f"replace or remove it (and its partner)") from None


def _check_same_size(splits) -> None:
    """Without data.size every image must have one size (only the headers are read here)."""
    seen = {}
    for items in splits.values():
        for image, _ in items:
            with _open(image, pixels=False) as img:
                seen.setdefault(img.size, image)
    if len(seen) > 1:
        (a, pa), (b, pb) = list(seen.items())[:2]
        raise SuiteError(f"data.size is not set, but the images differ in size ({pa.name}: {a[0]}x{a[1]}, "
                         f"{pb.name}: {b[0]}x{b[1]}, width x height); set data.size=[height, width] "
                         f"(data.fit=resize or crop)")


def _pair(image_path: Path, mask_path: Path, fit: str, size, channels: int):
    from PIL import Image

    image, mask = _open(image_path), _open(mask_path)
    if mask.mode not in ("1", "L", "P", "I", "I;16"):
        raise SuiteError(f"data file {mask_path} has mode {mask.mode}; masks must be single-channel PNGs of "
                         f"class ids (mode L or P)")
    if mask.size != image.size:
        raise SuiteError(f"data file {mask_path} is {mask.size[0]}x{mask.size[1]} but its image {image_path.name} is "
                         f"{image.size[0]}x{image.size[1]} (width x height); a mask must have its image's size")
    image = image.convert("RGB" if channels == 3 else "L")
    if size is not None:
        height, width = size
        if fit == "resize":
            image = image.resize((width, height), Image.BILINEAR)
            mask = mask.resize((width, height), Image.NEAREST)
        else:
            w, h = image.size
            if w < width or h < height:
                raise SuiteError(f"data.size={list(size)} with data.fit=crop needs images at least that large, but "
                                 f"{image_path} is {h}x{w} (height x width); use data.fit=resize or a smaller data.size")
            box = ((w - width) // 2, (h - height) // 2, (w - width) // 2 + width, (h - height) // 2 + height)
            image, mask = image.crop(box), mask.crop(box)
    return np.asarray(image, dtype=np.uint8), np.asarray(mask).astype(np.int64)
