"""COCO-format segmentation (data.name=coco_segmentation): masks from polygons, uncompressed and
compressed run-length encodings, read from a tiny instances file written here; bad input is one line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from suite.common.errors import SuiteError
from suite.data import coco
from suite.recipe import Recipe


def rle_counts(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE of a bool mask: runs over column-major pixels, starting with 0s."""
    flat = mask.T.reshape(-1).astype(np.uint8)
    counts, value, run = [], 0, 0
    for v in flat:
        if v == value:
            run += 1
        else:
            counts.append(run)
            value, run = v, 1
    counts.append(run)
    return counts


def rle_string(counts: list[int]) -> str:
    """pycocotools' rleToString, to write the compressed form the loader decodes."""
    out = []
    for i, x in enumerate(counts):
        if i > 2:
            x -= counts[i - 2]
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            out.append(chr((c | 0x20 if more else c) + 48))
    return "".join(out)


def test_rle_runs_are_column_major_starting_with_background():
    # 3 x 2 image; pixels in column-major order: (0,0) (1,0) (2,0) (0,1) (1,1) (2,1)
    mask = coco.rle_decode([1, 2, 3], 3, 2)
    assert mask.tolist() == [[False, False], [True, False], [True, False]]
    with pytest.raises(SuiteError, match="an RLE's counts sum to 5, not its size 3 x 2 = 6"):
        coco.rle_decode([1, 2, 2], 3, 2)


def test_compressed_rle_strings_decode_to_their_counts():
    rng = np.random.default_rng(0)
    for _ in range(20):
        mask = rng.random((17, 23)) < rng.random()
        counts = rle_counts(mask)
        assert coco.rle_counts_from_string(rle_string(counts)) == counts
        assert (coco.annotation_mask({"size": [17, 23], "counts": rle_string(counts)}, 17, 23) == mask).all()
    # long runs need several characters and negative differences; both round-trip
    assert coco.rle_counts_from_string(rle_string([1000, 5, 3, 70000, 1, 2])) == [1000, 5, 3, 70000, 1, 2]


def test_a_polygon_is_filled():
    mask = coco.polygons_mask([[2, 2, 7, 2, 7, 5, 2, 5]], 8, 10)  # a rectangle, corners included
    assert mask.sum() == 6 * 4 and mask[2:6, 2:8].all()


def _write_coco(data_root: Path) -> None:
    root = data_root / "coco"
    (root / "annotations").mkdir(parents=True)
    square = np.zeros((16, 20), dtype=bool)
    square[8:12, 10:16] = True
    for split, ids in (("train2017", [1, 2]), ("val2017", [3])):
        (root / split).mkdir()
        images, anns = [], []
        for i in ids:
            Image.fromarray(np.full((16, 20, 3), 40 * i, dtype=np.uint8)).save(root / split / f"{i:06d}.jpg")
            images.append({"id": i, "file_name": f"{i:06d}.jpg", "height": 16, "width": 20})
            # a large cat polygon, a small dog crowd as uncompressed RLE on top, a person (not chosen) as a string
            anns += [{"id": 10 * i, "image_id": i, "category_id": 17, "area": 160.0, "iscrowd": 0,
                      "segmentation": [[0, 0, 19, 0, 19, 7, 0, 7]]},
                     {"id": 10 * i + 1, "image_id": i, "category_id": 18, "area": 24.0, "iscrowd": 1,
                      "segmentation": {"size": [16, 20], "counts": rle_counts(square)}},
                     {"id": 10 * i + 2, "image_id": i, "category_id": 1, "area": 1.0, "iscrowd": 0,
                      "segmentation": {"size": [16, 20], "counts": rle_string(rle_counts(~square))}}]
        categories = [{"id": 1, "name": "person"}, {"id": 17, "name": "cat"}, {"id": 18, "name": "dog"}]
        (root / "annotations" / f"instances_{split}.json").write_text(
            json.dumps({"images": images, "annotations": anns, "categories": categories}))


def test_a_tiny_coco_file_loads_as_masks_of_the_chosen_categories(tmp_path):
    _write_coco(tmp_path)
    train, val, spec = coco.load(root=str(tmp_path), train="train2017", val="val2017", size=[16, 20],
                                 categories=[17, 18], max_images=None)
    assert spec.num_classes == 3 and spec.input_shape == (3, 16, 20)
    assert len(train) == 2 and len(val) == 1
    mask = train.tensors[1][0]
    assert (mask[:8] == 1).all()  # cat: the polygon rows 0-7
    assert (mask[8:12, 10:16] == 2).all()  # dog drawn over background (person left out)
    assert int((mask == 0).sum()) == 16 * 20 - 8 * 20 - 4 * 6
    assert abs(float(train.tensors[0].mean())) < 1e-5  # standardised on the training images


def test_the_recipe_accepts_coco_segmentation_with_unet(tmp_path):
    _write_coco(tmp_path)
    recipe = Recipe.model_validate({"name": "c", "model": {"name": "unet", "base_channels": 4, "depth": 2},
                                    "data": {"name": "coco_segmentation", "root": str(tmp_path), "size": [16, 20],
                                             "max_images": 1},
                                    "strategy": {"name": "single"}, "training": {"batch_size": 1}})
    assert recipe.data.target_kind() == "masks" and recipe.data.sizes() == (1, 1)
    assert recipe.data.spec().num_classes == 4  # background + person, cat, dog


@pytest.mark.parametrize("edit, message", [
    (lambda root: (root / "coco/annotations/instances_val2017.json").unlink(), "instances_val2017.json is missing"),
    (lambda root: (root / "coco/train2017/000002.jpg").unlink(), "000002.jpg is missing or not a readable image"),
    (lambda root: (root / "coco/annotations/instances_train2017.json").write_text("{"), "is not valid JSON"),
])
def test_bad_coco_input_is_one_line(tmp_path, edit, message):
    _write_coco(tmp_path)
    edit(tmp_path)
    with pytest.raises(SuiteError, match=message) as e:
        coco.load(root=str(tmp_path), train="train2017", val="val2017", size=[16, 20], categories=None,
                  max_images=None)
    assert "\n" not in str(e.value)


def test_an_unknown_category_names_the_known_ones(tmp_path):
    _write_coco(tmp_path)
    with pytest.raises(SuiteError, match="data.categories holds 99, which is not a category .* its ids: 1, 17, 18"):
        coco.load(root=str(tmp_path), train="train2017", val="val2017", size=[16, 20], categories=[99],
                  max_images=None)
