"""PipeDream-2BW: asynchronous, so not single's losses, but exactly its own rule
W(t+1) = W(t) - lr * grad f(W(t-1)), computed here by a one-process reference that shares no code
with the pipeline (the whole batch on a copy of the previous weights, the update on the newest).

The reference runs through the same loop, data and model factory as every run (it stands in for
``single``'s engine in the forked ranks), so the two differ only in how the rule is computed."""
from __future__ import annotations

import json

import pytest
import torch

from suite.common.errors import SuiteError
from suite.strategies import single
from suite.strategies.base import ModuleEngine
from tests.parity import assert_matches, make_recipe, step_losses
from tests.train.test_resume import crash_at_step_7_then_resume, steps_by_number

DEEPER = {"model": {"name": "mlp", "hidden": [32, 32, 32]}}  # enough blocks for 3 stages
# Options the update must honour (the lr schedule and weight decay are applied at each stage's
# own update, which comes a call later than the loop's step on the early stages).
SCHEDULED = {"optimizer": {"name": "sgd", "lr": 0.2, "momentum": 0.9, "weight_decay": 0.01,
                           "schedule": {"name": "step", "step_size_steps": 3, "gamma": 0.5}}}
ADAM = {"optimizer": {"name": "adam", "lr": 0.01, "weight_decay": 0.05}}


class Reference2BW(ModuleEngine):
    """One process: batch t's gradient at the previous weights W(t-1), applied to W(t)."""

    def __init__(self, setup, module):
        super().__init__(setup, module)
        self.previous = [p.detach().clone() for p in module.parameters()]

    def train_step(self, inputs, targets):
        newest = [p.detach().clone() for p in self.module.parameters()]
        with torch.no_grad():
            for p, old in zip(self.module.parameters(), self.previous):
                p.copy_(old)
        sums = self.accumulate_gradients(inputs, targets)  # the batch at W(t-1)
        with torch.no_grad():
            for p, new in zip(self.module.parameters(), newest):
                p.copy_(new)  # back to W(t), keeping the gradient
        self.optimizer.step()
        self.zero_grad()
        self.previous = newest
        return sums.result(len(inputs))


@pytest.fixture
def reference(tmp_path_factory):
    """Per-step losses and the run folder of the rule computed in one process (``single``'s recipe,
    its engine swapped only while this runs: the session's cached single baselines stay single's)."""
    def run(**sections):
        run_dir = tmp_path_factory.mktemp("reference")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(single, "build", lambda opts, setup: Reference2BW(setup, setup.prepare(setup.build_model())))
            return step_losses(make_recipe({"name": "single"}, **sections), run_dir), run_dir
    return run


def final(run_dir, key):
    return json.loads((run_dir / "summary.json").read_text())["final"][key]


@pytest.mark.slow
@pytest.mark.parametrize("stages, micro_batches, sections", [
    (2, 4, {}), (3, 4, DEEPER), (2, 2, SCHEDULED), (2, 8, ADAM)],
    ids=["2x4", "3x4", "schedule-and-decay", "adam"])
@pytest.mark.parity
def test_losses_follow_the_2bw_rule_exactly(stages, micro_batches, sections, reference, baseline_of, tmp_path):
    expected, reference_dir = reference(**sections)
    recipe = make_recipe({"name": "pipedream_2bw", "micro_batches": micro_batches}, world_size=stages, **sections)
    losses = step_losses(recipe, tmp_path)
    assert_matches(losses, expected)
    # Asynchronous: the first step (on W(0)) is single's, the second already is not (W(0) again).
    plain = baseline_of(make_recipe({"name": "single"}, **sections)).losses
    assert abs(losses[0] - plain[0]) <= 1e-10 and abs(losses[1] - plain[1]) > 1e-4
    # Evaluation drains the pipeline: the model evaluated is W(T+1), as the reference's.
    assert abs(final(tmp_path, "val_loss") - final(reference_dir, "val_loss")) <= 1e-10


@pytest.mark.slow
def test_each_stage_records_its_bubble_and_holds_two_versions(tmp_path):
    recipe = make_recipe({"name": "pipedream_2bw", "micro_batches": 4}, world_size=2, precision="fp32")
    step_losses(recipe, tmp_path)
    ranks = json.loads((tmp_path / "summary.json").read_text())["ranks"]
    for rank in ranks:
        metrics = rank["strategy_metrics"]
        assert metrics["schedule"].startswith("PipeDream-2BW") and metrics["bubble_fraction_formula"] == 0.0
        assert 0.0 <= metrics["bubble_fraction"] < 1.0
        held = rank["held_bytes"]
        # The optimizer's weights and at most two stashed versions; at the end W(T+1) and W(T).
        assert held["parameters"] == 3 * held["gradients"]


@pytest.mark.slow
def test_a_crashed_run_resumes_from_its_checkpoint_to_the_same_losses(tmp_path, monkeypatch):
    """The stashed version travels in the checkpoint: resumed at step 4, steps 5.. are the
    uninterrupted run's."""
    training = {"training": {"max_steps": 12, "log_every_steps": 4, "epochs": 1, "batch_size": 32, "seed": 1}}
    strategy = {"name": "pipedream_2bw", "micro_batches": 2}
    whole = step_losses(make_recipe(strategy, world_size=2, **training), tmp_path / "whole")
    saving = {"training": {**training["training"], "checkpoint_every_steps": 4}}
    recipe = make_recipe(strategy, world_size=2, **saving)
    cut = tmp_path / "cut"
    cut.mkdir()
    assert crash_at_step_7_then_resume(recipe, cut, monkeypatch) == 4
    assert_matches(steps_by_number(cut), whole)


@pytest.mark.parametrize("strategy, sections, message", [
    ({"micro_batches": 1}, {}, "micro_batches >= stages"),
    ({"micro_batches": 3}, {}, "micro_batches=3 must divide"),
    ({}, {"training": {"grad_clip_norm": 1.0, "max_steps": 2, "batch_size": 32, "epochs": 1, "seed": 1}},
     "training.grad_clip_norm"),
])
def test_what_it_cannot_run_is_refused_in_one_line(strategy, sections, message):
    with pytest.raises(SuiteError, match=message) as error:
        make_recipe({"name": "pipedream_2bw", **strategy}, world_size=2, **sections)
    assert "\n" not in str(error.value)


def test_one_rank_is_refused():
    with pytest.raises(SuiteError, match="at least 2 stages"):
        make_recipe({"name": "pipedream_2bw"}, world_size=1)
