"""Every recipe the project ships dry-runs: plain recipes with ``suite.submit --dry-run``, studies
with ``suite.study --dry-run`` (every arm through suite.submit's dry run) in their default (cpu)
profile, and the Fashion-MNIST study's full profile on tiny Fashion-MNIST files written here."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from suite.study import __main__ as study, arms
from suite.submit import cli
from tests.data.test_data import write_idx

RECIPES = sorted(Path("recipes").rglob("*.yaml"))
STUDIES = [p for p in RECIPES if "studies" in p.parts]


def test_the_recipes_folder_has_plain_recipes_and_studies():
    assert len(RECIPES) > len(STUDIES) > 0


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPES, ids=str)
def test_recipe_dry_runs(path, capsys):
    run = study.main if path in STUDIES else cli.main
    code = run([str(path), "--dry-run"])
    out, err = capsys.readouterr()
    import torch
    import yaml

    if (yaml.safe_load(path.read_text()).get("launch") or {}).get("device") == "cuda" and not torch.cuda.is_available():
        # a GPU recipe (for suite.plan and suite.advise on a GPU profile) on a machine without one:
        # refused before launch in one line naming the fix
        assert code == 2 and err.strip() == ("error: launch.device=cuda, but this machine has no GPU; use "
                                             "launch.device=auto or cpu"), err
        return
    assert code == 0, err
    assert "nothing launched (--dry-run)" in out


@pytest.mark.slow
def test_a_dry_run_prints_the_predicted_peak_memory_per_rank(capsys):
    import re

    assert cli.main(["recipes/quickstart.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    peak = float(re.search(r"predicted peak memory per rank ([0-9.]+) MiB", out).group(1))
    assert peak > 0.3  # above the 0.3 MiB quickstart's CNN holds: activations and temporaries on top


def _fashion_mnist(root: Path) -> None:
    rng = np.random.default_rng(0)
    raw = root / "FashionMNIST" / "raw"
    for split, n in (("train", 64), ("t10k", 32)):
        write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{split}-labels-idx1-ubyte", np.arange(n) % 10)


def test_fashion_mnist_study_full_profile_dry_runs_on_its_data(tmp_path, capsys):
    _fashion_mnist(tmp_path)
    # every arm on Fashion-MNIST (the larger-data arms read CIFAR-10, which is not here)
    code = study.main(["recipes/studies/fashion_mnist_dp.yaml", "--profile", "full", f"data.root={tmp_path}",
                       "--arms", "single,ddp,allreduce,mpi,tf_single,tf_mirrored,tf_mirrored_loop,hogwild", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.count("nothing launched (--dry-run)") == 8  # single, ddp, allreduce, mpi, the three TensorFlow arms, hogwild


@pytest.mark.parametrize("path", STUDIES, ids=str)
def test_every_profile_of_every_study_validates(path):
    """Every arm of every profile passes the recipe checks (keys, degrees, batch split, strategy
    rules) without its data; the full profiles read data sets that are not here to dry-run."""
    raw, spec = arms.split(path)
    assert "cpu" in spec["profiles"] and "full" in spec["profiles"]
    for profile in spec["profiles"]:
        arms.check_arms(arms.arm_recipes(raw, spec, profile, 2))
