import pytest

from suite import recipe as recipes
from suite.common.errors import SuiteError


def write(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


BASE = "model: {name: mlp}\ndata: {name: digits}\nstrategy: {name: ddp}\nlaunch: {tasks_per_node: 2}\n"


def test_overrides_reach_any_field_with_yaml_types(tmp_path):
    (r,) = recipes.load(write(tmp_path, BASE), ["training.epochs=3", "model.hidden=[8, 8]", "optimizer.lr=0.5"])
    assert r.name == "r" and r.training.epochs == 3 and r.model.hidden == [8, 8] and r.optimizer.lr == 0.5


def test_sweep_expands_to_one_named_recipe_per_point(tmp_path):
    text = BASE + "sweep:\n  strategy.name: [ddp, allreduce]\n  training.batch_size: [32, 64]\n"
    points = recipes.load(write(tmp_path, text))
    assert [(p.strategy.name, p.training.batch_size) for p in points] == [
        ("ddp", 32), ("ddp", 64), ("allreduce", 32), ("allreduce", 64)]
    assert len({p.name for p in points}) == 4


def test_a_sweep_over_whole_sections_names_each_point_by_what_tells_it_apart(tmp_path):
    text = (BASE + "sweep:\n  strategy: [{name: ddp}, {name: zero, stage: 2}, {name: zero, stage: 3}]\n"
            "  training.init_perturbation: [0.0, 4.440892098500626e-16]\n")
    names = [p.name for p in recipes.load(write(tmp_path, text))]
    assert names == [f"r-{s}-init_perturbation{p}" for s in ("ddp", "zero_stage2", "zero_stage3")
                     for p in ("0", "4.44089e-16")]
    twins = "sweep:\n  strategy: [{name: zero, stage: 2}, {name: zero, stage: 2}]\n"
    same = recipes.load(write(tmp_path, BASE + twins))
    assert [p.name for p in same] == ["r-strategy_name_zero_stage_2"] * 2  # nothing tells them apart: the whole section


def test_fingerprint_ignores_launch_but_not_training(tmp_path):
    path = write(tmp_path, BASE)
    (a,), (b,), (c,) = (recipes.load(path), recipes.load(path, ["launch.timeout_min=5"]),
                        recipes.load(path, ["training.seed=9"]))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_micro_batch_is_global_batch_over_data_parallel_ranks_and_accumulation(tmp_path):
    (r,) = recipes.load(write(tmp_path, BASE), ["training.batch_size=64", "training.grad_accumulation=4"])
    assert (r.layout().dp_size, r.layout().accumulation_batch) == (2, 8)


def test_a_malformed_override_is_refused(tmp_path):
    with pytest.raises(SuiteError, match="must look like key.path=value"):
        recipes.load(write(tmp_path, BASE), ["training.epochs"])


def test_switching_a_section_by_name_drops_the_old_choice_s_keys(tmp_path):
    text = "model: {name: mlp, hidden: [8]}\ndata: {name: digits, val_fraction: 0.3}\nstrategy: {name: single}\n"
    (r,) = recipes.load(write(tmp_path, text), ["data.n_train=100", "data.name=synthetic", "model.name=cnn"])
    assert (r.data.name, r.data.n_train, r.model.name) == ("synthetic", 100, "cnn")
    (same,) = recipes.load(write(tmp_path, text), ["model.name=mlp"])  # same name: keys stay
    assert same.model.hidden == [8]
