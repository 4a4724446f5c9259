"""A strategy carries its own rules (suite.strategies.costs, docs/architecture.md "A strategy's
rules"): every registered strategy declares its communication rule, overlap rule, fake-run
capability and search space on its options class; the planner refuses, in one line, a strategy
that declares none instead of giving it a default cost model."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Literal

import pytest

from suite.common.errors import SuiteError
from suite.planner import analytic, fake_run, table, timing
from suite.planner.profile import COLLECTIVE_KINDS, StepProfile
from suite.strategies import STRATEGIES, costs, layout as layouts
from suite.strategies.base import StrategyOptions


class Bare(StrategyOptions):
    """A strategy that declares none of the planner's rules."""
    name: Literal["bare"] = "bare"


def _one_line_naming(error: pytest.ExceptionInfo, *words: str) -> None:
    message = str(error.value)
    assert "\n" not in message and "'bare'" in message and "docs/architecture.md" in message, message
    assert all(w in message for w in words), message


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_declares_every_rule(name):
    options_class = STRATEGIES[name].Options
    assert costs.undeclared(options_class) == []
    costs.require(options_class)  # does not raise
    options = options_class()
    assert isinstance(options.overlap, costs.Overlap)
    assert set(options.overlap.share) <= set(COLLECTIVE_KINDS) and options.overlap.window in ("backward", "step")
    assert isinstance(options.cannot_fake, str)
    assert callable(options.comm_rule) and isinstance(options_class.search_space(4), list)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_each_communication_rule_speaks_the_planners_kinds(name):
    options = STRATEGIES[name].Options()
    layout = layouts.build(options, world_size=4, batch_size=64)
    step = costs.StepSizes(layout=layout, gradient_bytes=4000, parameter_bytes=4000, parameter_tensors=6,
                           units=(2000, 1500, 500))
    comm = options.comm_rule(step)
    assert set(comm) <= set(COLLECTIVE_KINDS)
    assert all(isinstance(b, int) and isinstance(c, int) and b >= 0 and c >= 1 for b, c in comm.values())


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_each_search_space_validates_as_the_strategys_options(name, world):
    options_class = STRATEGIES[name].Options
    space = options_class.search_space(world)
    for variant in space:
        assert variant["name"] == name
        assert isinstance(options_class(**variant), options_class)
    assert len({tuple(sorted(v.items())) for v in space}) == len(space)  # no variant twice


def test_the_search_spaces_offer_the_choices_that_matter():
    assert [v["stage"] for v in STRATEGIES["zero"].Options.search_space(4)] == [0, 1, 2, 3]
    fsdp = STRATEGIES["fsdp"].Options.search_space(8)
    assert {v["reshard_after_forward"] for v in fsdp if "reshard_after_forward" in v} == {True, False}
    assert sorted(v["replicate"] for v in fsdp if "replicate" in v) == [2, 4]  # HSDP: shard groups of 2 and 4 ranks
    tensor = STRATEGIES["tensor"].Options.search_space(8)
    assert sorted(v["tp"] for v in tensor) == [2, 4, 8] and all(v["dp"] * v["tp"] == 8 for v in tensor)
    pipeline = STRATEGIES["pipeline"].Options.search_space(4)
    assert {v["stages"] for v in pipeline} == {2, 4} and all(v["dp"] * v["stages"] == 4 for v in pipeline)
    assert STRATEGIES["single"].Options.search_space(1) == [] and STRATEGIES["ddp"].Options.search_space(4) == []


@pytest.mark.slow
def test_the_planner_refuses_a_strategy_that_declares_no_rules(monkeypatch):
    assert costs.undeclared(Bare) == list(costs.RULES)
    # The table, before any point is planned.
    monkeypatch.setitem(STRATEGIES, "bare", SimpleNamespace(Options=Bare))
    with pytest.raises(SuiteError) as error:
        table.strategy_specs("ddp,bare", {"name": "ddp"})
    _one_line_naming(error, "communication rule (comm_rule)", "overlap rule (overlap)",
                     "fake-run capability (cannot_fake)", "search space (search_space)")
    # A point, before its fake run (whose failures fall back to the analytic rule).
    with pytest.raises(SuiteError) as error:
        fake_run.plan_point(SimpleNamespace(strategy=Bare()), 2)
    _one_line_naming(error, "comm_rule")
    # The analytic rule, at any world size.
    for world in (1, 2):
        with pytest.raises(SuiteError) as error:
            analytic.communication(SimpleNamespace(strategy=Bare(), world_size=world), 100, 100, {})
        _one_line_naming(error, "comm_rule")
    # The time model, by name or by the options themselves.
    profile = StepProfile(strategy="bare", world_size=2, held_bytes={}, peak_bytes=0, flops=10**9, samples=64)
    calibration = {"compute": {"cores": 2, "peak_flops_per_s_by_threads": {"1": 1e10}}, "collectives": {}}
    for options in ({}, {"strategy": Bare()}):
        with pytest.raises(SuiteError) as error:
            timing.predict_step_time(profile, calibration, options)
        _one_line_naming(error, "overlap rule (overlap)")


def test_a_strategy_missing_one_rule_is_told_that_one():
    class Partial(Bare):
        overlap = costs.NOTHING_HIDDEN
        cannot_fake = ""

        def comm_rule(self, step):
            return {}

    with pytest.raises(SuiteError) as error:
        costs.require(Partial)
    _one_line_naming(error, "search space (search_space)")
    assert "comm_rule" not in str(error.value) and "overlap" not in str(error.value)
