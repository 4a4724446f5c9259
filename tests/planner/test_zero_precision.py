"""ZeRO's bytes as DeepSpeed's bf16 engine holds them (2-byte parameters and gradients, an fp32
master copy and Adam's two moments: 12 bytes), checked against the ZeRO paper's Figure 1 and
against DeepSpeed's own step run through on fake tensors."""
from __future__ import annotations

import pytest

from suite import recipe as recipes
from suite.planner import analytic, fake_run
from suite.planner.memory import predicted_held_bytes

# ZeRO (Rajbhandari et al., arXiv 1910.02054), Figure 1: 7.5B parameters, Adam in mixed
# precision, 64 data-parallel ranks; model states per device, GB = 1e9 bytes.
FIGURE_1_GB = {"ddp": 120.0, "zero:stage=1": 31.4, "zero:stage=2": 16.6, "zero:stage=3": 1.88}
GPT_7_5B = {"name": "gpt", "model": {"name": "transformer", "dim": 4096, "heads": 32, "layers": 36},
            "data": {"name": "synthetic_tokens", "vocab": 50304, "seq_len": 1024, "n_train": 64, "n_val": 64},
            "optimizer": {"name": "adam", "lr": 1e-4}, "training": {"batch_size": 64, "epochs": 1, "precision": "bf16"},
            "launch": {"tasks_per_node": 64}, "tracking": {"wandb": "disabled"}}


def _strategy(label: str) -> dict:
    name, _, stage = label.partition(":stage=")
    return {"name": name, **({"stage": int(stage)} if stage else {})}


@pytest.mark.parametrize("label", list(FIGURE_1_GB))
def test_model_states_per_rank_match_the_zero_papers_figure_1(label):
    recipe = recipes.validate({**GPT_7_5B, "strategy": _strategy(label)})
    held = predicted_held_bytes(recipe)
    psi = held["parameters_count"]
    # the paper's formulas at this model's own size (7.67B: a vocabulary of 50,304), to the byte
    expected = {"ddp": 16 * psi, "zero:stage=1": 4 * psi + 12 * psi / 64, "zero:stage=2": 2 * psi + 14 * psi / 64,
                "zero:stage=3": 16 * psi / 64}[label]
    states = sum(held["per_rank"].values())
    assert states == pytest.approx(expected, rel=1e-9)
    assert abs(states / 1e9 / FIGURE_1_GB[label] - 1) <= 0.10, (label, states / 1e9)


MLP = {"name": "m", "model": {"name": "mlp", "hidden": [128, 128]}, "data": {"name": "digits"},
       "optimizer": {"name": "adamw", "lr": 0.003}, "training": {"batch_size": 64, "epochs": 1, "precision": "bf16"},
       "launch": {"tasks_per_node": 4}, "tracking": {"wandb": "disabled"}}


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.slow
def test_zeros_fake_step_runs_through_and_holds_what_its_rule_says(stage):
    """DeepSpeed reads a norm and its overflow flags during its step; the fake run answers them
    and runs on: its held bytes are the rule's (to DeepSpeed's padding), stage 1's gradients
    whole, stage 2's a quarter, every message in 2-byte elements."""
    recipe = recipes.validate({**MLP, "strategy": {"name": "zero", "stage": stage}})
    status, fake = fake_run.run_isolated(recipe, 4, timeout_s=280)
    assert status == "ok" and fake.source == "fake", fake
    rule = analytic.profile(fake_run.at_world(recipe, 4), 4, "under test")
    for part, n in rule.held_bytes.items():
        assert abs(fake.held_bytes[part] - n) <= 64, (part, fake.held_bytes, rule.held_bytes)
    whole = sum(p.numel() for p in recipe.model_info().build_meta().parameters()) * 2
    assert fake.held_bytes["gradients"] == (whole if stage == 1 else pytest.approx(whole / 4, abs=64))
    assert fake.comm_bytes["all_gather"] == pytest.approx(whole, abs=64)
