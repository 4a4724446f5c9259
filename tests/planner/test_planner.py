"""The planner (python -m suite.plan): a fake step of the real strategy code under a fake process
group predicts what a rank holds and sends, checked against the analytic shares, the library's
padding rule, DDP's and FSDP's communication rules, and a real run's measured held bytes."""
from __future__ import annotations

import math
import time

import subprocess
import sys

import pytest
import yaml

from suite import recipe as recipes
from suite.common.errors import SuiteError
from suite.planner.memory import predicted_held_bytes
from suite.plan import __main__ as cli
from suite.planner import analytic, fake_run, table
from suite.record.run_record import read_json
from tests.parity import BASE, make_recipe, step_losses

TRANSFORMER = yaml.safe_load(open("recipes/tensor_transformer.yaml"))


def _raw(model: dict, data: dict, batch_size: int) -> dict:
    return {"name": "plan", "model": model, "data": data, "strategy": {"name": "ddp"},
            "optimizer": {"name": "adamw", "lr": 0.001},
            "training": {"epochs": 1, "batch_size": batch_size, "seed": 0}, "tracking": {"wandb": "disabled"}}


MLP = _raw({"name": "mlp", "hidden": [256, 256]}, {"name": "digits"}, 1024)
SMALL_TRANSFORMER = _raw(TRANSFORMER["model"], TRANSFORMER["data"], 1024)


def _profiles(raw, strategies: str, worlds) -> dict:
    points = table.plan(raw, table.strategy_specs(strategies, raw["strategy"]), worlds, jobs=2, progress=lambda _: None)
    failed = [(p.label, p.world_size, p.excluded or p.error) for p in points if not p.profile]
    assert not failed, failed
    return {(p.label, p.world_size): p.profile for p in points}


def _meta_model(raw):
    return recipes.validate({**raw, "strategy": {"name": "single"}}).model_info().build_meta()


def _fsdp_rank0_bytes(params, world: int) -> int:
    """FSDP2's padding rule: each parameter's dim 0 is cut into ``world`` chunks of
    ceil(dim0 / world) rows (the last ones padded or empty); rank 0 holds the first."""
    return sum(min(math.ceil(p.shape[0] / world), p.shape[0]) * (p.numel() // p.shape[0]) * 4 for p in params)


@pytest.mark.slow
def test_world_1024_plans_in_under_a_minute_and_shards_parameters_by_the_rules():
    started = time.monotonic()
    for raw in (MLP, SMALL_TRANSFORMER):
        _check_world_1024(raw, _profiles(raw, "fsdp,tensor:tp=2,zero:stage=3", [1024]))
    # Two forks at a time; six points, each a few seconds of CPU (more on a shared machine).
    assert time.monotonic() - started < 60


def _check_world_1024(raw, profiles) -> None:
    params = list(_meta_model(raw).parameters())
    total = sum(p.numel() for p in params) * 4

    fsdp = profiles[("fsdp", 1024)]
    assert fsdp.source == "fake"
    # Not total / 1024: these parameters have fewer rows than ranks, so rank 0 holds one row of each.
    assert fsdp.held_bytes["parameters"] == _fsdp_rank0_bytes(params, 1024)
    assert total // 1024 <= fsdp.held_bytes["parameters"] < total / 50

    tensor = profiles[("tensor:tp=2", 1024)]  # dp=512 (FSDP2) x tp=2
    assert tensor.source == "fake" and tensor.comm_bytes.get("all_reduce", 0) > 0  # TP's partial sums
    assert 0 < tensor.held_bytes["parameters"] < total / 50

    zero = profiles[("zero:stage=3", 1024)]
    assert zero.source == "analytic" and "ZeRO-3" in zero.notes
    assert zero.held_bytes["parameters"] == int(total / 1024)  # the analytic 1/N


def test_ddp_all_reduces_its_gradients_once_and_fsdp_gathers_twice_per_step():
    raw = _raw({"name": "mlp", "hidden": [32, 32]}, {"name": "digits"}, 64)
    profiles = _profiles(raw, "ddp,fsdp,allreduce", [2])
    gradient_bytes = sum(p.numel() for p in _meta_model(raw).parameters()) * 4

    ddp = profiles[("ddp", 2)]
    assert ddp.comm_bytes == {"all_reduce": gradient_bytes}
    assert ddp.comm_calls == {"all_reduce": 1}  # one bucket: far below bucket_cap_mb
    # The hand-written one: one call per parameter, same bytes.
    allreduce = profiles[("allreduce", 2)]
    assert allreduce.comm_bytes == {"all_reduce": gradient_bytes}
    assert allreduce.comm_calls["all_reduce"] == len(list(_meta_model(raw).parameters()))
    # each call's size counted: the parameters' own sizes, one call each
    sizes = {}
    for p in _meta_model(raw).parameters():
        sizes[str(p.numel() * 4)] = sizes.get(str(p.numel() * 4), 0) + 1
    assert allreduce.comm_sizes == {"all_reduce": sizes} and ddp.comm_sizes == {"all_reduce": {str(gradient_bytes): 1}}
    # FSDP2, every dim 0 even: parameters gathered before each block's forward and again before
    # its backward (reshard_after_forward), gradients reduce-scattered once.
    fsdp = profiles[("fsdp", 2)]
    assert fsdp.comm_bytes == {"all_gather": 2 * gradient_bytes, "reduce_scatter": gradient_bytes}
    assert fsdp.flops == ddp.flops > 0
    # FSDP2's copies: shards into each gather's buffer (1/2 of it), the result out (all of it),
    # the gradients into the reduce-scatter's input; DDP copies nothing of its own.
    assert fsdp.copy_bytes == 2 * gradient_bytes // 2 + 2 * gradient_bytes + gradient_bytes
    assert ddp.copy_bytes == 0


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "allreduce", "fsdp"])
def test_the_analytic_rule_each_run_records_sends_what_the_real_strategy_code_sends(strategy):
    """Each run's own prediction uses the analytic profile (no fake run of the strategy); its
    collectives, FLOPs and peak are held to the fake run of the real code."""
    raw = _raw({"name": "mlp", "hidden": [64, 64]}, {"name": "digits"}, 64)
    fake = _profiles(raw, strategy, [2])[(strategy, 2)]
    assert fake.source == "fake"
    recipe = fake_run.at_world(recipes.validate({**raw, "strategy": {"name": strategy}}), 2)
    rule = analytic.profile(recipe, 2, "under test")
    assert rule.comm_bytes == fake.comm_bytes
    assert rule.comm_calls == fake.comm_calls
    assert rule.copy_bytes == fake.copy_bytes
    assert rule.flops == fake.flops
    # The estimate leaves out Adam's step counters (4 bytes per parameter tensor).
    assert rule.held_bytes == pytest.approx(fake.held_bytes, rel=1e-3)
    # Both peaks are held to a real run's measured one instead (below): the fake run sees neither
    # FSDP's storages resized back up nor the allocator's own small blocks.


@pytest.mark.slow
@pytest.mark.parametrize("raw", [MLP, SMALL_TRANSFORMER], ids=["mlp", "transformer"])
def test_tensor_parallel_all_reduces_counted_from_its_layout_equal_the_real_codes(raw):
    """Row-wise layers all-reduce their output in forward, column-wise ones their input's
    gradient in backward (none for the data): the rule each run's prediction uses, held to the
    fake run of the real DTensor code."""
    raw = {**raw, "training": {**raw["training"], "batch_size": 16}}
    fake = _profiles(raw, "tensor", [2])[("tensor", 2)]
    assert fake.source == "fake" and fake.comm_calls.get("all_reduce", 0) > 0
    rule = analytic.profile(fake_run.at_world(recipes.validate({**raw, "strategy": {"name": "tensor"}}), 2), 2, "test")
    assert rule.comm_calls == fake.comm_calls and rule.comm_bytes == fake.comm_bytes


@pytest.mark.slow
def test_tensor_times_data_parallel_counts_fsdps_gathers_over_the_data_parallel_group():
    """tp 2 x dp 2: the tensor group's all-reduces as above, and FSDP2 over the data-parallel
    group: each unit of the rank's tensor shard gathered twice, reduce-scattered once. Calls as
    the fake run of the real code counts them; bytes within 5 % (the rule leaves out FSDP2's
    padding of each parameter's first dimension to a multiple of dp: 3.2 % here, where the
    10-wide head's shards are padded)."""
    raw = {**MLP, "training": {**MLP["training"], "batch_size": 32}, "strategy": {"name": "tensor", "dp": 2},
           "launch": {"tasks_per_node": 4}}
    fake = _profiles(raw, "tensor:dp=2", [4])[("tensor:dp=2", 4)]
    assert fake.source == "fake" and fake.comm_calls.get("reduce_scatter", 0) > 0
    rule = analytic.profile(fake_run.at_world(recipes.validate({**raw, "strategy": {"name": "tensor", "dp": 2}}), 4),
                            4, "test")
    assert rule.comm_calls == fake.comm_calls
    for kind, n_bytes in fake.comm_bytes.items():
        assert rule.comm_bytes[kind] == pytest.approx(n_bytes, rel=0.05), kind


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_batch_norm_synced_over_the_ranks_is_counted_as_the_real_code_calls_it(strategy):
    """training.sync_batchnorm (the default): per batch-norm layer and pass one all-gather of the
    ranks' statistics and one all-reduce in backward, whatever the strategy; the analytic rule
    counts what the fake run of the real code records, and nothing is added when it is off."""
    raw = _raw({"name": "resnet18", "width": 0.125}, {"name": "synthetic", "shape": [3, 16, 16], "classes": 10,
                                                      "n_train": 64, "n_val": 16}, 16)
    layers = sum(isinstance(m, __import__("torch").nn.BatchNorm2d) for m in _meta_model(raw).modules())
    assert layers == 20
    fake = _profiles(raw, strategy, [2])[(strategy, 2)]
    recipe = fake_run.at_world(recipes.validate({**raw, "strategy": {"name": strategy}}), 2)
    rule = analytic.profile(recipe, 2, "under test")
    assert rule.comm_calls == fake.comm_calls and rule.comm_bytes == fake.comm_bytes
    assert rule.data_comm == fake.data_comm and {k: c for k, (_, c) in rule.data_comm.items()} == {
        "all_gather": layers, "all_reduce": layers}  # batch norm's, timed over the data-parallel ranks
    assert rule.copy_bytes == fake.copy_bytes  # FSDP copies its own gathers' bytes, not batch norm's
    assert rule.comm_calls["all_gather"] >= layers  # FSDP's own gathers come on top
    unsynced = recipes.validate({**raw, "strategy": {"name": strategy}, "training": {**raw["training"], "sync_batchnorm": False}})
    plain = analytic.profile(fake_run.at_world(unsynced, 2), 2, "under test")
    assert rule.comm_calls["all_reduce"] - plain.comm_calls.get("all_reduce", 0) == layers
    assert rule.comm_calls["all_gather"] - plain.comm_calls.get("all_gather", 0) == layers


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ddp", "allreduce"])
def test_predicted_held_bytes_equal_a_real_runs_at_world_2_and_the_peak_is_within_20_percent(strategy, tmp_path):
    # Wide enough (38 MiB of parameters) that the tensors make the peak, not the libraries'
    # own small allocations
    recipe = make_recipe({"name": strategy}, world_size=2, training={**BASE["training"], "max_steps": 2},
                         model={"name": "mlp", "hidden": [3072, 3072]})
    step_losses(recipe, tmp_path)
    summary = read_json(tmp_path / "summary.json")
    measured = summary["ranks"][0]["held_bytes"]
    status, predicted = fake_run.run_isolated(recipe, 2)
    assert status == "ok", predicted
    assert predicted.source == "fake"
    assert predicted.held_bytes == measured
    assert predicted.held_bytes == {k: int(v) for k, v in predicted_held_bytes(recipe)["per_rank"].items()}
    # The peak the run measured (the bytes malloc handed out, suite.record.allocated), held to the
    # planner's fake run and to the analytic rule the run recorded for itself.
    peak = max(r["peak_allocated_bytes"] for r in summary["ranks"])
    for what, bytes_ in (("fake run", predicted.peak_bytes), ("recorded", summary["predicted"]["peak_bytes"])):
        assert abs(bytes_ / peak - 1) <= 0.2, (what, bytes_, peak)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 3])
def test_zeros_recorded_peak_is_within_20_percent_of_a_real_runs(stage, tmp_path):
    """The analytic rule a run records for itself (no fake run of DeepSpeed), held to a real run. A 4 MiB
    bucket rather than the default 1.9 GiB, which would make any prediction of the rest pass
    (and a gradient larger than the bucket, which DeepSpeed reduces alone).

    Fresh ranks, as suite.submit starts them: a rank forked from this test process inherits its
    heap, and memory of that heap freed during the measured steps lowers the count (by 17 MiB at
    stage 1 after the rest of the suite had run: suite.record.allocated says what it misses)."""
    recipe = make_recipe({"name": "zero", "stage": stage, "config": {"zero_optimization": {"reduce_bucket_size": 2**20}}},
                         world_size=2, training={**BASE["training"], "max_steps": 2},
                         model={"name": "mlp", "hidden": [3072, 3072]})
    step_losses(recipe, tmp_path, start="spawn")
    summary = read_json(tmp_path / "summary.json")
    peak = max(r["peak_allocated_bytes"] for r in summary["ranks"])
    assert abs(summary["predicted"]["peak_bytes"] / peak - 1) <= 0.2, (summary["predicted"]["peak_bytes"], peak)


@pytest.mark.slow
def test_the_cli_writes_the_plan_and_says_why_strategies_are_left_out(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**_raw({"name": "mlp", "hidden": [16]}, {"name": "digits"}, 8),
                                    "launch": {"tasks_per_node": 2}}))
    code = cli.main([str(path), "--world", "2,16", "--strategies", "single,ddp", "--out", str(tmp_path / "plan")])
    out = capsys.readouterr().out
    assert code == 0
    assert "| ddp | 2 | fake |" in out
    assert "single @ 2: strategy single runs on exactly 1 rank" in out
    assert "ddp @ 16: training.batch_size=8 must divide into 16 data-parallel ranks" in out
    for name in ("plan.md", "plan.csv", "plan.png", "profiles.json"):
        assert (tmp_path / "plan" / name).stat().st_size > 0


@pytest.mark.slow
def test_the_plan_takes_key_value_anywhere_and_prints_no_library_noise(tmp_path):
    """As a user types it: overrides after --world; the strategies whose real code cannot run on
    fake tensors say why, and no warning, log line or traceback reaches the output."""
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**_raw({"name": "mlp", "hidden": [16]}, {"name": "digits"}, 8),
                                    "launch": {"tasks_per_node": 2}}))
    proc = subprocess.run([sys.executable, "-m", "suite.plan", str(path), "--world", "2", "training.batch_size=16",
                           "--strategies", "ddp,hogwild,param_server,zero:stage=3", "--out", str(tmp_path / "plan")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both and "Warning" not in both and "WARNING" not in both, both[-3000:]
    assert "global batch 16" in proc.stdout
    assert "hogwild @ 2: analytic: its ranks share one model through shared memory" in proc.stdout
    assert "param_server @ 2: analytic: its workers reach the server through torch.distributed.rpc" in proc.stdout
    assert "fake run failed" not in proc.stdout


def test_bad_arguments_are_one_line_errors(tmp_path):
    with pytest.raises(SuiteError, match="--world='2,x'"):
        cli._worlds("2,x")
    with pytest.raises(SuiteError, match="'nope' is not a strategy"):
        table.strategy_specs("ddp,nope", {})
    with pytest.raises(SuiteError, match="must be key=value"):
        table.strategy_specs("zero:stage", {})


def _counted_train(recipe, run_dir):
    """A rank of ``recipe`` that counts, per training step, the collectives and sends its process
    group makes, as the planner's counter sees them at the dispatcher: [{kind: calls}, ...]."""
    from suite.planner.counting import Collectives
    from suite.strategies import pipeline
    from suite.tasks import train as rank_task

    steps = []
    train_step = pipeline.PipelineStageEngine.train_step

    def counted_step(self, *args, **kwargs):
        with Collectives() as counted:
            out = train_step(self, *args, **kwargs)
        steps.append(dict(counted.calls))
        return out
    pipeline.PipelineStageEngine.train_step = counted_step
    rank_task.train(recipe, run_dir)
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("dp_mode", ["fully_shard", "replicate"])
def test_a_data_parallel_pipelines_rule_counts_the_collectives_its_stages_call(dp_mode, tmp_path):
    """Pipeline x data parallel at world 4 (2 stages x dp 2): the first stage's collectives per
    step, counted in a real run, equal its analytic rule's (the pipeline cannot run a fake step).
    With ``fully_shard`` each stage is one FSDP unit, its root: its parameters gathered once, at
    the first chunk, its gradients reduce-scattered once after the last. The rule once counted
    one all-reduce instead (one call of two)."""
    from tests.harness import run_ranks

    recipe = make_recipe({"name": "pipeline", "dp": 2, "stages": 2, "micro_batches": 4, "dp_mode": dp_mode},
                         world_size=4, precision="fp32", training={**BASE["training"], "max_steps": 3})
    (tmp_path / "run").mkdir()
    counts = run_ranks(_counted_train, 4, recipe, tmp_path / "run")
    seen = counts[0][-1]  # rank 0, the first stage; its last step (the first also infers the stages' shapes)
    rule = analytic.profile(recipe, 4, "under test").comm_calls
    assert seen == {k: v for k, v in rule.items() if v}, (seen, rule)
    assert ("all_gather" in seen) == (dp_mode == "fully_shard")
