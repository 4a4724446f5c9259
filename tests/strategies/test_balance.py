"""training.balance: ranks holding unequal parts of the global batch train exactly like one process.

The shares are forced (training.balance=shares) where the losses are compared, so each test is
deterministic; the speed measurement, which is not, is checked for what it decides (shares that
sum to the batch, from the speeds each rank measured) and still compared with single, whatever
shares it chose. suite/train/balance.py says how the batch is split and why the losses match."""
import json

import pytest
from torch.utils.data import DistributedSampler

from suite.strategies.base import ModuleEngine
from suite.train import balance
from tests.parity import BASE, assert_matches, make_recipe, step_losses

TRAINING = BASE["training"]


def shares(values, **more):
    return {"training": {**TRAINING, "balance": "shares", "balance_shares": values, **more}}


@pytest.mark.slow
@pytest.mark.parity
@pytest.mark.parametrize("name", ["ddp", "allreduce"])
def test_unequal_shares_match_single_process(name, baseline, tmp_path):
    assert_matches(step_losses(make_recipe({"name": name}, world_size=2, **shares([24, 8])), tmp_path), baseline)


@pytest.mark.slow
@pytest.mark.parity
def test_unequal_shares_with_accumulation_match_single_process(baseline, tmp_path):
    """Shares the passes do not divide (25 = 13 + 12, 7 = 4 + 3): each pass weighed by its samples."""
    recipe = make_recipe({"name": "ddp"}, world_size=2, **shares([25, 7], grad_accumulation=2))
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.slow
def test_the_comparison_catches_losses_not_weighted_by_share(baseline, tmp_path, monkeypatch):
    """Each rank's mean loss unweighted (what the equal split does): the gradient is then the mean
    of the ranks' means, not the batch's mean, and the parity check must fail."""
    monkeypatch.setattr(ModuleEngine, "pass_weight", lambda self, samples: 1.0)
    losses = step_losses(make_recipe({"name": "ddp"}, world_size=2, **shares([24, 8])), tmp_path)
    with pytest.raises(AssertionError, match="differ from the baseline"):
        assert_matches(losses, baseline)


@pytest.mark.slow
@pytest.mark.parity
def test_speed_balance_measures_then_splits_and_matches_single(baseline, tmp_path, monkeypatch):
    """With a short probe (the ranks are forked after the patch), the balancer times each rank
    after the warm-up step and sets shares from the speeds; the losses are single's whichever
    shares it chose, and the run record says what was measured and decided."""
    monkeypatch.setattr(balance, "MEASURE_S", 0.05)
    recipe = make_recipe({"name": "ddp"}, world_size=2, training={**TRAINING, "balance": "speed"})
    assert_matches(step_losses(recipe, tmp_path), baseline)
    summary = json.loads((tmp_path / "summary.json").read_text())
    decided = summary["balance"]
    assert decided["after_step"] == balance.WARMUP_STEPS and decided["passes"] >= balance.MIN_PASSES
    assert sum(decided["shares"]) == TRAINING["batch_size"] and min(decided["shares"]) >= 1
    assert len(decided["samples_per_s"]) == 2 and min(decided["samples_per_s"]) > 0
    assert [r["batch_share"] for r in summary["ranks"]] == decided["shares"]
    assert all(r["compute_s"] > 0 and r["collective_s"] >= 0 for r in summary["ranks"])


def test_shares_split_the_equal_splits_global_batch():
    """Every step's global batch is the samples the equal split's ranks read together, in two
    epochs, before and after the shares change mid-epoch."""
    size, ranks, batch = 100, 2, 16
    equal = [DistributedSampler(range(size), num_replicas=ranks, rank=r, shuffle=True, seed=3, drop_last=True)
             for r in range(ranks)]
    mine = [balance.SharedBatches(size, ranks, r, batch, 3, [8, 8]) for r in range(ranks)]
    for epoch in (0, 1):
        for s in equal + mine:
            s.set_epoch(epoch)
        orders = [list(s) for s in equal]
        expected = [sorted(i for o in orders for i in o[t * 8:(t + 1) * 8]) for t in range(len(orders[0]) // 8)]
        iterators = [iter(m) for m in mine]
        got = []
        for t in range(len(expected)):
            if t == 2:  # a change applies from the next batch on
                for m in mine:
                    m.shares = [11, 5]
            parts = [next(it) for it in iterators]
            assert [len(p) for p in parts] == ([8, 8] if t < 2 else [11, 5])
            got.append(sorted(i for p in parts for i in p))
        assert got == expected and len(mine[0]) == len(expected)
        for m in mine:
            m.shares = [8, 8]


@pytest.mark.parametrize("speeds, batch, least, expected", [
    ([2.0, 1.0], 32, 1, [21, 11]),  # 21.33 and 10.67: the larger remainder takes the spare sample
    ([1.0, 1.0], 32, 1, [16, 16]),
    ([100.0, 1.0], 32, 2, [30, 2]),  # never below one sample per accumulation pass
    ([3.0, 2.0, 1.0], 60, 1, [30, 20, 10]),
])
def test_proportional_shares(speeds, batch, least, expected):
    assert balance.proportional_shares(speeds, batch, least) == expected
