"""Semantic segmentation from a COCO-format data set: images and an instances annotation file.

Layout, under ``data.root`` (default ``data/``, or $SCALESUITE_DATA, as for the other data sets),
in a folder ``coco/`` as COCO ships it:

    root/coco/annotations/instances_<train>.json     root/coco/<train>/<file_name>
    root/coco/annotations/instances_<val>.json       root/coco/<val>/<file_name>

with ``data.train`` / ``data.val`` the split names (default ``train2017`` / ``val2017``). Each
annotation's ``segmentation`` is either polygons (``[[x1, y1, x2, y2, ...], ...]``, filled) or a
run-length encoding (``{"size": [h, w], "counts": [...]}``, uncompressed, as COCO stores crowds; or
``counts`` as COCO's compressed string), decoded here without pycocotools. The mask of an image
holds, per pixel, 0 for background or the class of the annotation drawn last there; annotations
are drawn largest area first, so a small object on a large one stays visible. Class ids are
1..K in the order of ``data.categories`` (COCO category ids; default: every category of the
training file, in id order), K + 1 classes with the background; annotations of other categories
are left out.

Every pair is brought to ``data.size: [H, W]`` (bilinear for the image, nearest for the mask).
``data.max_images`` reads only the first N images of a split (by image id): COCO's 118k training
images do not fit in memory at once. Images are scaled to [0, 1] and standardised per channel with
the training set's mean and standard deviation, like ``segmentation_folder``. A missing file, a
malformed annotation or a category id not in the file is one line naming the key or the file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import ClassVar, Literal, Optional

import numpy as np
import torch
from pydantic import Field, PositiveInt
from torch.utils.data import TensorDataset
from typing_extensions import Annotated

from suite.data import DataSpec
from suite.data.base import LoadedOnce
from suite.common.errors import SuiteError


class CocoSegmentation(LoadedOnce):
    name: Literal["coco_segmentation"] = "coco_segmentation"
    targets: ClassVar = "masks"
    root: str = os.environ.get("SCALESUITE_DATA", "data")  # holds coco/annotations/ and coco/<split>/
    train: str = "train2017"
    val: str = "val2017"
    size: Annotated[list[PositiveInt], Field(min_length=2, max_length=2)] = [128, 128]  # [height, width]
    categories: Optional[list[PositiveInt]] = None  # COCO category ids to segment; default: all
    max_images: Optional[PositiveInt] = None  # per split, the first N by image id

    def check_available(self) -> None:
        self.loaded()  # reads and checks every file, once


OPTIONS = [CocoSegmentation]


def load(*, root: str, train: str, val: str, size, categories, max_images):
    base = Path(root).expanduser() / "coco"
    files = {split: _read_json(base / "annotations" / f"instances_{name}.json", root)
             for split, name in (("train", train), ("val", val))}
    known = sorted(c["id"] for c in files["train"].get("categories", []))
    chosen = list(categories) if categories else known
    missing = [c for c in chosen if c not in known]
    if missing:
        raise SuiteError(f"data.categories holds {missing[0]}, which is not a category of "
                         f"annotations/instances_{train}.json; its ids: {', '.join(map(str, known[:20]))}")
    class_of = {cat: i + 1 for i, cat in enumerate(chosen)}
    images, masks = {}, {}
    for split, name in (("train", train), ("val", val)):
        pairs = [_pair(base / name, image, anns, class_of, size)
                 for image, anns in _images(files[split], max_images, f"instances_{name}.json")]
        if not pairs:
            raise SuiteError(f"data.root={root!r}: annotations/instances_{name}.json lists no images")
        images[split] = torch.from_numpy(np.stack([i for i, _ in pairs])).float().div_(255).permute(0, 3, 1, 2)
        masks[split] = torch.from_numpy(np.stack([m for _, m in pairs]).astype(np.int64))
    mean = images["train"].mean(dim=(0, 2, 3), keepdim=True)
    std = images["train"].std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    train_set, val_set = (TensorDataset((images[s] - mean) / std, masks[s]) for s in ("train", "val"))
    return train_set, val_set, DataSpec("coco_segmentation", (3, *size), len(chosen) + 1)


def _read_json(path: Path, root: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError:
        raise SuiteError(f"data.root={root!r}: {path} is missing; expected ROOT/coco/annotations/instances_<split>.json "
                         f"and ROOT/coco/<split>/ (data.train, data.val name the splits)") from None
    except json.JSONDecodeError as e:
        raise SuiteError(f"data file {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise SuiteError(f"data file {path} is not a COCO instances file: it needs images, annotations, categories")
    return data


def _images(data: dict, max_images, shown: str):
    """(image record, its annotations) in image-id order, the first ``max_images``."""
    by_image: dict = {}
    for ann in data.get("annotations", []):
        by_image.setdefault(ann.get("image_id"), []).append(ann)
    records = sorted(data["images"], key=lambda r: r["id"])[:max_images]
    for r in records:
        if "file_name" not in r or "height" not in r or "width" not in r:
            raise SuiteError(f"data file {shown}: image {r.get('id')} lacks file_name, height or width")
    return [(r, by_image.get(r["id"], [])) for r in records]


def _pair(folder: Path, image: dict, anns: list, class_of: dict, size):
    from PIL import Image

    path = folder / image["file_name"]
    try:
        with Image.open(path) as img:
            pixels = img.convert("RGB")
    except OSError as e:
        raise SuiteError(f"data file {path} is missing or not a readable image ({str(e)[:60]}); the annotation file "
                         f"lists it as image {image['id']}") from None
    height, width = image["height"], image["width"]
    mask = np.zeros((height, width), dtype=np.uint8)
    for ann in sorted(anns, key=lambda a: -float(a.get("area", 0))):
        cls = class_of.get(ann.get("category_id"))
        if cls is not None:
            mask[annotation_mask(ann.get("segmentation"), height, width, image["id"])] = cls
    h, w = size
    pixels = pixels.resize((w, h), Image.BILINEAR)
    mask = Image.fromarray(mask).resize((w, h), Image.NEAREST)
    return np.asarray(pixels, dtype=np.uint8), np.asarray(mask)


def annotation_mask(segmentation, height: int, width: int, image_id=None) -> np.ndarray:
    """One annotation's pixels (bool, H x W): filled polygons or a run-length encoding."""
    if isinstance(segmentation, list):
        return polygons_mask(segmentation, height, width)
    if isinstance(segmentation, dict) and "counts" in segmentation:
        counts = segmentation["counts"]
        counts = rle_counts_from_string(counts) if isinstance(counts, str) else counts
        return rle_decode(counts, *segmentation.get("size", (height, width)))
    raise SuiteError(f"an annotation of image {image_id} has segmentation {str(segmentation)[:40]!r}; COCO gives "
                     f"polygons (a list of [x1, y1, ...]) or an RLE ({{size, counts}})")


def polygons_mask(polygons: list, height: int, width: int) -> np.ndarray:
    from PIL import Image, ImageDraw

    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    for poly in polygons:
        if len(poly) >= 6:  # at least 3 points
            draw.polygon([(float(poly[i]), float(poly[i + 1])) for i in range(0, len(poly) - 1, 2)], fill=1)
    return np.asarray(canvas, dtype=bool)


def rle_decode(counts: list, height: int, width: int) -> np.ndarray:
    """COCO's RLE: alternating runs of 0 and 1 (starting with 0) over the pixels in column-major order."""
    flat = np.zeros(height * width, dtype=bool)
    at, value = 0, False
    for run in counts:
        if value:
            flat[at:at + run] = True
        at += run
        value = not value
    if at != height * width:
        raise SuiteError(f"an RLE's counts sum to {at}, not its size {height} x {width} = {height * width}")
    return flat.reshape((width, height)).T


def rle_counts_from_string(text: str) -> list[int]:
    """COCO's compressed RLE string (pycocotools' rleFrString): 5 bits per character with a
    continuation bit, signed, each count after the second stored as a difference to the one two back."""
    counts: list[int] = []
    p = 0
    while p < len(text):
        x, k, more = 0, 0, True
        while more:
            c = ord(text[p]) - 48
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts
