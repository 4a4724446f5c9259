"""The model's compute, timed when a prediction is made (suite.planner.model_time, model_rate):
the model's own step and the strategy's code as one rank, a pipeline's stages one by one through
their schedule, a tensor-parallel rank as rank 0 of its own world."""
import json

import pytest

from suite.planner import model_rate, model_time, pipeline_time, timing
from suite.planner.predict import prediction
from tests.planner.hand_calibration import hand_calibration
from tests.planner.small_recipe import small_recipe as _recipe


@pytest.mark.slow
def test_the_prediction_times_the_models_own_step_and_the_strategys_as_one_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    recipe = _recipe({"name": "fsdp"}, 1, 2)
    cal = {"key": "k", "backend": "gloo", "collectives": {"all_gather": {"alpha_s": 1e-4, "beta_bytes_per_s": 1e9},
                                                           "reduce_scatter": {"alpha_s": 1e-4, "beta_bytes_per_s": 1e9}},
           "compute": {"cores": 2, "peak_flops_per_s_by_threads": {"1": 1e15, "2": 2e15}}}  # an absurd peak, unused
    got = prediction(recipe, cal)
    assert "timed at rank batch 32 on 1 thread(s) when predicted, 2 stepping at once" in got["rate"], got
    cached = json.loads((tmp_path / "scalesuite" / "calibration" / model_rate.CACHE_FILE).read_text())
    by_strategy = {e["strategy"]: e for e in cached.values()}
    assert set(by_strategy) == {"single", "fsdp"}  # the model's own step, and FSDP's code around it as one rank
    for entry in by_strategy.values():
        assert entry["batch"] == 32 and entry["threads"] == 1 and entry["together"] == 2  # both ranks' cores busy
    # The compute: the model's timed step (this rank computes the whole model at the timed batch), not
    # the peak's share, plus what FSDP's code costs it beyond that; its copies are in that cost.
    overhead = max(0.0, by_strategy["fsdp"]["step_s"] - by_strategy["single"]["step_s"])
    assert got["compute_s"] == pytest.approx(by_strategy["single"]["step_s"] + overhead, rel=1e-6)
    assert got["copy_s"] == 0.0
    # Timed once: a second prediction of the same model and batch reads the cache.
    assert model_rate.timed(recipe, 1, 2)["cached"] is True
    assert model_rate.timed(recipe, 1, 2, own_strategy=True)["cached"] is True
    # A calibration begun on a busy machine: the prediction (a run's summary, submit --dry-run) says so.
    assert "calibration_busy_load" not in got and not any("busy" in n for n in got["notes"])
    busy = prediction(recipe, {**cal, "load_average_at_start": 1.36})
    assert busy["calibration_busy_load"] == 1.36 and "began on a busy machine (load average 1.36)" in busy["notes"][-1]
    assert busy["calibration_busy_note"] in busy["notes"]
    # submit --dry-run prints it under the prediction, whatever other notes come after it.
    from suite.submit import cli
    monkeypatch.setattr("suite.planner.predict.prediction", lambda r: {**busy, "notes": [*busy["notes"], "a later note"]})
    assert cli._predicted_text(recipe).endswith(f"note: {busy['calibration_busy_note']}")
    # So does one made from a calibration during which the machine changed speed.
    assert "calibration_speed_note" not in got
    swung = prediction(recipe, {**cal, "compute": {**cal["compute"], "speed_samples": [[0, 121e9], [40.2, 60e9]]}})
    assert swung["calibration_speed_spread"] == pytest.approx(121 / 60 - 1)
    assert swung["calibration_speed_note"] in swung["notes"] and "changed by 102%" in swung["calibration_speed_note"]
    monkeypatch.setattr("suite.planner.predict.prediction", lambda r: swung)
    assert cli._predicted_text(recipe).endswith(f"note: {swung['calibration_speed_note']}")


@pytest.mark.slow
def test_a_pipeline_x_data_parallel_rank_is_timed_with_its_stages_wrapper(tmp_path, monkeypatch):
    """A pipeline cannot run as one rank of its own; with dp > 1 each stage is wrapped (FSDP2),
    which costs its rank per step whatever the stage's share of the FLOPs. Its stages are timed
    one by one, plain and wrapped, and the difference is the rank's own cost, run on its share
    of a core as the model's compute is."""
    from tests.planner.hand_calibration import hand_calibration, step_profile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = {"name": "mlp", "hidden": [64, 64, 64]}
    plain = _recipe({"name": "pipeline", "stages": 2, "micro_batches": 2}, 1, 2, model)
    assert plain.strategy.stage_wrapper(plain.layout()) is None  # dp 1: nothing wraps a stage
    recipe = _recipe({"name": "pipeline", "stages": 2, "dp": 2, "micro_batches": 2}, 1, 4, model)
    key = timing.model_key(recipe)
    got = model_rate.with_model_rate(hand_calibration(cores=2), recipe, key, 4)
    entry = got["compute"]["models"][key]
    assert entry["strategy"] == "pipeline" and entry["overhead_s"] > 0, entry
    cached = json.loads((tmp_path / "scalesuite" / "calibration" / model_rate.CACHE_FILE).read_text())
    (stages,) = [e for e in cached.values() if "stage" in e]
    assert stages["stage"] in (0, 1) and stages["wrapped_s"] > stages["plain_s"] > 0
    # the model's own step at the rank's whole batch (its chunks as accumulation passes), not one chunk's
    (single,) = [e for e in cached.values() if e["strategy"] == "single"]
    assert single["batch"] == recipe.layout().rank_batch == 32
    options = {**timing.options_of(recipe), "model": key}
    profile = step_profile("pipeline", 4, flops=10**6)
    without = {**got, "compute": {**got["compute"], "models": {key: {**entry, "overhead_s": 0.0}}}}
    added = (timing.predict_step_time(profile, got, options)["compute_s"]
             - timing.predict_step_time(profile, without, options)["compute_s"])
    assert added == pytest.approx(entry["overhead_s"] / 0.5)  # 4 ranks on 2 cores: half a core each


@pytest.mark.slow
def test_a_tensor_parallel_rank_is_timed_as_rank_0_of_its_world_on_a_fake_process_group(tmp_path, monkeypatch):
    """Tensor parallelism splits layers: one rank at tp 1 computes every layer whole, so its
    degrees are kept and rank 0 of its world is timed, peers faked (torch's fake process group:
    collectives return at once), at the batch a tensor-parallel rank sees (its data shard's,
    whole). The prediction's compute is that step; a data-parallel strategy is timed as before."""
    from tests.planner.hand_calibration import step_profile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = {"name": "mlp", "hidden": [256, 256]}
    recipe = _recipe({"name": "tensor", "tp": 2, "dp": 2}, 1, 4, model)
    assert model_time.at_world(recipe) and not model_time.at_world(_recipe({"name": "fsdp"}, 1, 4, model))
    key = timing.model_key(recipe)
    got = model_rate.with_model_rate(hand_calibration(cores=2), recipe, key, 4)
    entry = got["compute"]["models"][key]
    assert entry["strategy"] == "tensor" and entry["rank_step_s"] > 0, entry
    cached = json.loads((tmp_path / "scalesuite" / "calibration" / model_rate.CACHE_FILE).read_text())
    (rank,) = [e for e in cached.values() if e.get("at_world")]
    assert rank["at_world"] == 4 and rank["batch"] == 64 // 2 and rank["strategy"] == "tensor"  # dp 2 shards 64
    options = {**timing.options_of(recipe), "model": key}
    t = timing.predict_step_time(step_profile("tensor", 4, flops=10**6), got, options)
    assert t["compute_s"] == pytest.approx(entry["rank_step_s"] / 0.5)  # 4 ranks on 2 cores
    assert prediction(recipe, hand_calibration(cores=2))["step_time_s"] > 0  # the whole path, as a run records it


@pytest.mark.slow
def test_a_pipelines_compute_is_its_busiest_stage_timed_alone_through_its_own_schedule(tmp_path, monkeypatch):
    """A stage of many FLOPs and few weights (an MLP whose first layer is wide) is not its FLOP
    share of the whole model's step: each stage is stepped alone through the pipeline's schedule
    with its optimizer, and the busiest one's step, with its share of all of them, sets the rank's
    compute and bubble."""
    from tests.planner.hand_calibration import hand_calibration, step_profile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = {"name": "mlp", "hidden": [256, 32, 32]}
    for schedule in ("gpipe", "1f1b"):
        recipe = _recipe({"name": "pipeline", "stages": 2, "micro_batches": 2, "schedule": schedule}, 1, 2, model)
        assert recipe.strategy.stage_schedule(recipe.layout()) == schedule
        key = timing.model_key(recipe)
        got = model_rate.with_model_rate(hand_calibration(cores=2), recipe, key, 2)
        entry = got["compute"]["models"][key]
        assert entry["strategy"] == "pipeline" and entry["overhead_s"] == 0.0  # dp 1: no wrapper
        assert len(entry["stage_s"]) == 2 and min(entry["stage_s"]) > 0, entry
        options = {**timing.options_of(recipe), "model": key}
        profile = step_profile("pipeline", 2, flops=10**6)
        t = timing.predict_step_time(profile, got, options)
        busiest, total = max(entry["stage_s"]), sum(entry["stage_s"])
        assert t["compute_s"] == pytest.approx(busiest)  # a core each: the busiest stage's step
        assert t["bubble"] == pytest.approx(pipeline_time.pipeline_bubble(2, 2, busiest / total))
        assert "stages timed one by one" in t["rate"]
    # Not a pipeline: no stages to time.
    assert _recipe({"name": "ddp"}, 1, 2, model).strategy.stage_schedule(_recipe({"name": "ddp"}, 1, 2).layout()) is None


def test_a_strategy_is_timed_as_one_rank_of_its_own_with_its_degrees_dropped_where_it_can_be():
    def alone(strategy, per_node=2, **training):
        return model_time.one_rank_recipe(_recipe(strategy, 1, per_node, **training), own_strategy=True)

    one = alone({"name": "fsdp", "replicate": 2}, 4)
    assert one.strategy.name == "fsdp" and one.world_size == 1 and one.strategy.replicate == 1
    assert one.training.batch_size == 16  # the rank's batch of the 4-rank run
    assert alone({"name": "tensor", "tp": 2}).strategy.name == "tensor"  # its machinery runs at tp 1
    assert alone({"name": "zero", "stage": 3}).strategy.stage == 3
    assert alone({"name": "pipeline", "micro_batches": 2}).strategy.name == "single"  # stages need peers
    assert alone({"name": "hogwild"}).strategy.name == "single"  # asynchronous replicas need peers
    assert model_time.one_rank_recipe(_recipe({"name": "fsdp"}, 1, 2)).strategy.name == "single"
