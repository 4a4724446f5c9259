"""The advisor's band (suite/advise/trust.py): which of its orders it can vouch for. Configurations
predicted closer than the band are marked not settled; the band is measured from the user's own
recorded runs where there are enough of them, else the benchmark's default, and says which."""
import json
import math

import pytest
import yaml

from suite.advise import trust

KEY = "vm-gloo-1threads"


def _run(root, name, model, predicted, measured, key=KEY, world=2):
    folder = root / name / "20261129-000000"
    folder.mkdir(parents=True)
    (folder / "recipe.yaml").write_text(yaml.safe_dump({"model": model, "data": {"name": "synthetic"}}))
    (folder / "summary.json").write_text(json.dumps({
        "world_size": world, "global_batch": 32, "precision": "fp32", "device": "cpu", "step_time_s": measured,
        "predicted": {"step_time_s": predicted, "calibration": key}}))


def test_not_settled_names_the_best_ranked_configuration_within_the_band():
    # 95 is within 10 % of 100; 80 is clear of both; 79 is within 10 % of 80 but not of 95.
    assert trust.not_settled([100, 95, 80, 79, 50], 0.10) == [None, 0, None, 2, None]
    assert trust.not_settled([100, 100], 0.0) == [None, 0]  # a tie is never settled
    assert trust.not_settled([], 0.1) == []


def test_band_is_the_median_pairwise_error_of_runs_of_one_model(tmp_path):
    mlp, cnn = {"name": "mlp", "hidden": [64]}, {"name": "cnn"}
    # mlp: log errors 0, +0.1, -0.1 -> pairs 0.1, 0.1, 0.2; cnn: 0, +0.05, 0 -> 0.05, 0, 0.05.
    for i, e in enumerate([0.0, 0.1, -0.1]):
        _run(tmp_path, f"mlp{i}", mlp, math.exp(e) * 0.02, 0.02)
    for i, e in enumerate([0.0, 0.05, 0.0]):
        _run(tmp_path, f"cnn{i}", cnn, math.exp(e) * 0.5, 0.5)
    # Not paired with these: another calibration, another world, a run without a prediction.
    _run(tmp_path, "other-key", mlp, 0.04, 0.02, key="another-host")
    _run(tmp_path, "other-world", mlp, 0.08, 0.02, world=4)
    _run(tmp_path, "unpredicted", mlp, None, 0.02)
    within, source = trust.band(tmp_path, {"key": KEY})
    assert within == pytest.approx(math.exp(0.075) - 1)  # median of 0, 0.05, 0.05, 0.1, 0.1, 0.2 (+ none of 4)
    assert source.startswith("measured: ") and "7 recorded runs" in source and "6 pairs" in source


def test_band_falls_back_to_the_default_and_says_so(tmp_path):
    _run(tmp_path, "a", {"name": "mlp"}, 0.03, 0.02)
    _run(tmp_path, "b", {"name": "mlp"}, 0.02, 0.02)
    within, source = trust.band(tmp_path, {"key": KEY})  # one pair: too few
    assert within == trust.DEFAULT_BAND and "too few" in source and "1 pair(s)" in source
    within, source = trust.band(tmp_path / "missing", {"key": KEY})
    assert within == trust.DEFAULT_BAND
    within, source = trust.band(tmp_path, {"key": "preset-h100", "from_specs": True})
    assert within == trust.DEFAULT_BAND and "not measured on this hardware" in source
