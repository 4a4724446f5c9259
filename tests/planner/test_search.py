"""The advisor's pieces: each collective kind timed over its own group and link, the presets'
compute from specs, and the search making a configuration fit by checkpointing or accumulating
before it gives up on it (the model's compute timed when a prediction is made:
test_model_timing.py)."""
import json

import pytest

from suite import recipe as recipes
from suite.planner import alpha_beta, analytic, groups, hardware, search, timing
from suite.planner.profile import StepProfile
from suite.strategies.splitting import balanced_split
from tests.planner.hand_calibration import ALPHA_S, BETA, hand_calibration
from tests.planner.small_recipe import RAW, small_recipe as _recipe


def _groups(recipe) -> dict:
    options = timing.options_of(recipe)
    profile = StepProfile(recipe.strategy.name, recipe.world_size, {}, 0, 0, 64)
    return {kind: groups.group_of(kind, options, profile) for kind in ("all_reduce", "all_gather", "reduce_scatter", "send")}


def test_each_collective_runs_over_its_own_group_and_link():
    # HSDP on 2 nodes of 4: units gathered within a node's shard group, replicas reduced across nodes.
    hsdp = _groups(_recipe({"name": "fsdp", "replicate": 2}, nodes=2, per_node=4))
    assert hsdp["all_gather"] == (4, "intra") and hsdp["reduce_scatter"] == (4, "intra")
    assert hsdp["all_reduce"] == (2, "inter")
    # Tensor x data: the layers' all-reduces inside a node, FSDP2's gathers over dp across nodes.
    tensor = _groups(_recipe({"name": "tensor", "dp": 2, "tp": 4}, nodes=2, per_node=4))
    assert tensor["all_reduce"] == (4, "intra") and tensor["all_gather"] == (2, "inter")
    # Plain data parallelism over 8 ranks on 2 nodes: one group of 8 that crosses nodes.
    assert _groups(_recipe({"name": "ddp"}, nodes=2, per_node=4))["all_reduce"] == (8, "inter")
    assert _groups(_recipe({"name": "ddp"}, nodes=1, per_node=4))["all_reduce"] == (4, "intra")
    # A pipeline's messages go to the neighbouring stage.
    four_layers = {"name": "mlp", "hidden": [64, 64, 64]}  # a stage each
    assert _groups(_recipe({"name": "pipeline", "stages": 4, "dp": 2}, nodes=2, per_node=4, model=four_layers))["send"] \
        == (2, "intra")


def test_synced_batch_norm_is_timed_over_the_data_parallel_ranks_whatever_the_strategy_declares():
    """FSDP declares its all-reduce over the replicas (none in plain FSDP) and HSDP its gathers over
    a shard group; a synced batch norm's all-gather and all-reduce run over every rank that reads
    other samples. Timed over its own group, nothing of them was charged in plain FSDP (its
    predicted step 23 % short of MobileNetV2's measured one at 2 ranks, 31 % at 4), and none of it
    is hidden: each call sits between layers."""
    model = {"name": "resnet18", "width": 0.125}
    data = {"name": "synthetic", "shape": [3, 16, 16], "classes": 10, "n_train": 64, "n_val": 16}
    for strategy, own in (({"name": "fsdp"}, {"all_reduce": 1}), ({"name": "fsdp", "replicate": 2}, {"all_gather": 2})):
        recipe = recipes.validate({**RAW, "model": model, "data": data, "strategy": strategy,
                                   "launch": {"tasks_per_node": 4}})
        profile = analytic.profile(recipe, 4, "under test")
        layers = 20  # resnet18's batch-norm layers: an all-gather and an all-reduce each
        assert {k: c for k, (_, c) in profile.data_comm.items()} == {"all_gather": layers, "all_reduce": layers}
        options = timing.options_of(recipe)
        for kind, size in own.items():  # the strategy's own group for the kind, not batch norm's
            assert groups.group_of(kind, options, profile) == (size, "intra")
            assert groups.group_of(kind, options, profile, data=True) == (4, "intra")
        per_kind = timing.comm_time_s(profile, hand_calibration(), options)
        bytes_, calls = profile.data_comm["all_reduce"]
        assert per_kind["all_reduce@data"] == pytest.approx(alpha_beta.call_time_s("all_reduce", 4, bytes_, ALPHA_S, BETA, calls))
        # On devices the strategy's overlap rule holds (on a CPU whose cores all compute nothing
        # is hidden), and it names none of batch norm's calls.
        t = timing.predict_step_time(profile, hand_calibration(cores=4), {**options, "device": "cuda"})
        per_kind = t["comm_s_by_kind"]
        _, overlap = timing.rule(options)
        hidden = min(sum(overlap.share.get(k, 0.0) * v for k, v in per_kind.items()),
                     t["compute_s"] * timing.BACKWARD_SHARE if overlap.window == "backward" else t["compute_s"])
        assert hidden > 0 and t["exposed_comm_s"] == pytest.approx(t["comm_s"] - hidden)
        assert t["exposed_comm_s"] >= per_kind["all_reduce@data"] + per_kind["all_gather@data"]


def test_an_inter_node_collective_is_timed_at_the_inter_node_link():
    h100 = hardware.preset("h100")
    profile = StepProfile("ddp", 16, {}, 0, 0, 64, comm_bytes={"all_reduce": 2**30}, comm_calls={"all_reduce": 1})
    one_node = timing.comm_time_s(profile, h100, timing.options_of(_recipe({"name": "ddp"}, 1, 16)))["all_reduce"]
    two_nodes = timing.comm_time_s(profile, h100, timing.options_of(_recipe({"name": "ddp"}, 2, 8)))["all_reduce"]
    # 2 x 15/16 x 1 GiB over 450 GB/s NVLink against 50 GB/s InfiniBand: 9x, less the latency terms.
    assert 8.5 < two_nodes / one_node < 9.1


def test_a_preset_computes_at_its_peak_times_the_assumed_share_and_says_so():
    a100 = hardware.preset("a100")
    rate, how = timing.compute_rate(a100, 8, precision="bf16")
    assert rate == pytest.approx(312e12 * hardware.EFFICIENCY)
    assert "from specs, not measured" in how
    assert timing.compute_rate(a100, 8, precision="fp32")[0] == pytest.approx(19.5e12 * hardware.EFFICIENCY)
    assert "from published specs, not measured" in hardware.describe(a100)
    with pytest.raises(Exception, match="presets: h100, h200, a100, a100_40gb"):
        hardware.load("v100")


def test_a_calibration_of_one_node_stands_for_the_links_between_nodes_and_says_so():
    fits = {"all_reduce": {"alpha_s": 1e-4, "beta_bytes_per_s": 1e9}}
    cal = {"key": "k", "hosts": ["a"], "collectives": fits, "links": {"intra": fits}}
    assert hardware.link_fits(cal, "inter") is fits
    assert "across nodes assumed the same" in hardware.describe(cal)
    assert "busy" not in hardware.describe(cal)  # a calibration from before the load was recorded


def test_a_calibration_begun_on_a_busy_machine_is_named_so_wherever_the_planner_describes_it():
    """advise prints ``hardware.describe`` on every output: a calibration begun with half a runnable
    process per core or more (other work slowing what it timed) says so there, as the calibrate
    command did when it was taken."""
    fits = {"all_reduce": {"alpha_s": 1e-4, "beta_bytes_per_s": 1e9}}
    cal = {"key": "k", "hosts": ["a"], "collectives": fits, "links": {"intra": fits}, "compute": {"cores": 2},
           "load_average_at_start": 1.36}
    assert hardware.busy_load(cal) == 1.36
    assert "begun on a busy machine (load average 1.36)" in hardware.describe(cal)
    quiet = {**cal, "load_average_at_start": 0.22}
    assert hardware.busy_load(quiet) is None and "busy" not in hardware.describe(quiet)
    assert hardware.busy_load({**cal, "compute": {"cores": 8}}) is None


def test_a_calibration_during_which_the_machine_changed_speed_is_named_so():
    """A shared VM's speed can swing while it is calibrated (one thread's matmul 60 and 121
    GFLOP/s a second apart): the calibrate command and ``hardware.describe`` say how far, since a
    step measured there varies as much (each prediction too: the test after this); a steady
    machine says nothing."""
    from suite.calibrate import measure

    fits = {"all_reduce": {"alpha_s": 1e-4, "beta_bytes_per_s": 1e9}}
    swung = {"key": "k", "hosts": ["a"], "collectives": fits, "links": {"intra": fits},
             "compute": {"cores": 2, "speed_samples": [[0, 121e9], [40.2, 60e9], [61.0, 110e9]]}}
    assert hardware.speed_spread(swung) == pytest.approx(121 / 60 - 1)
    assert "speed changed by 102% while it was measured" in hardware.describe(swung)
    assert measure.speed_warning(swung).startswith("calibrate: this machine's speed changed while it was measured: "
                                                   "one thread's matmul ran 60 to 121 GFLOP/s (102% apart) within 61 s")
    steady = {**swung, "compute": {"cores": 2, "speed_samples": [[0, 100e9], [40, 115e9], [60, 108e9]]}}
    assert hardware.speed_spread(steady) is None and measure.speed_warning(steady) is None
    assert "speed" not in hardware.describe(steady)
    assert hardware.speed_spread({**swung, "compute": {"cores": 2}}) is None  # a calibration from before the samples


def test_the_search_checkpoints_then_accumulates_to_fit_and_says_why_it_gives_up():
    h100 = hardware.preset("h100")
    raw = {**RAW, "training": {**RAW["training"], "batch_size": 4096}}
    specs = [("ddp", {"name": "ddp"})]
    roomy = search.search(raw, 1, 2, h100, 2**40, strategies=specs, fake=False, progress=lambda _: None)
    assert roomy[0].accumulation == 1 and not roomy[0].checkpointing and not roomy[0].excluded
    peak = roomy[0].profile.peak_bytes
    # A memory between the peaks with and without accumulation: the search accumulates.
    tight = search.search(raw, 1, 2, h100, int(peak * 0.97), strategies=specs, fake=False, progress=lambda _: None)
    assert not tight[0].excluded and tight[0].accumulation > 1, tight[0].excluded
    assert f"training.grad_accumulation={tight[0].accumulation}" in tight[0].overrides
    none = search.search(raw, 1, 2, h100, 1024, strategies=specs, fake=False, progress=lambda _: None)
    assert none[0].excluded.startswith("does not fit:") and "GiB available" in none[0].excluded


def test_a_pipeline_rank_computes_its_busiest_stages_share():
    """Parameter-balanced cuts leave a CNN's compute uneven: the stage with most of it sets the pace."""
    from suite.planner import analytic

    raw = {**RAW, "model": {"name": "vgg11", "width": 0.25, "classifier_hidden": 128},
           "data": {"name": "synthetic", "shape": [3, 32, 32], "classes": 10, "n_train": 64, "n_val": 8}}
    recipe = recipes.validate({**raw, "strategy": {"name": "pipeline", "stages": 2}})
    step = analytic.model_step(recipe)
    blocks = step["block_flops"]
    assert len(blocks) == len(step["block_parameters"]) and sum(blocks) > 0
    split = balanced_split(step["block_parameters"], 2)  # the pipeline's own cut: parameters balanced
    busiest = max(sum(blocks[:split[0]]), sum(blocks[split[0]:])) / sum(blocks)
    assert analytic.stage_share(recipe, step) == pytest.approx(busiest)
    assert 0.5 < busiest < 1  # uneven, not all on one stage
    profile = analytic.profile(recipe, 2, "under test", step=step)
    assert profile.flops == int(step["flops"] * busiest)
    # A strategy that does not cut the model: an even share of the replica's ranks (here: all of it).
    ddp = recipes.validate({**raw, "strategy": {"name": "ddp"}})
    assert analytic.stage_share(ddp, analytic.model_step(ddp)) is None


def test_under_nccl_a_small_all_reduce_at_1024_ranks_takes_a_trees_latency_not_a_rings():
    from suite.planner import alpha_beta

    ring = alpha_beta.call_time_s("all_reduce", 1024, 4e5, 20e-6, 50e9)
    tree = alpha_beta.call_time_s("all_reduce", 1024, 4e5, 20e-6, 50e9, trees=True)
    assert ring == pytest.approx(2046 * 20e-6 + 2 * 1023 / 1024 * 4e5 / 50e9)
    assert tree == pytest.approx(2 * 10 * 20e-6 + 2 * 4e5 / 50e9)
    # Two ranks: the ring is no worse, and is what is taken.
    assert alpha_beta.call_time_s("all_reduce", 2, 4e8, 20e-6, 50e9, trees=True) == \
        alpha_beta.call_time_s("all_reduce", 2, 4e8, 20e-6, 50e9)


@pytest.mark.slow
def test_a_run_with_a_calibration_records_the_prediction_its_rank_0_timed(tmp_path, monkeypatch):
    """Rank 0 predicts after training, timing the model in a fresh process, and the run records it.
    (A timing in the rank itself hung in ranks the harness forked after tests/recipe's dry runs had
    run in the same session; this test does not reproduce that hang, only the path that replaced it.)"""
    import socket

    from suite.record.run_record import read_json
    from suite.tasks import train as rank_task
    from tests.harness import run_ranks
    from tests.parity import make_recipe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cal = {"key": "k", "backend": "gloo", "hosts": [socket.gethostname()],
           "collectives": {"all_reduce": {"alpha_s": 1e-4, "beta_bytes_per_s": 1e9}},
           "compute": {"cores": 2, "peak_flops_per_s_by_threads": {"1": 1e10, "2": 2e10}}}
    folder = tmp_path / "cache" / "scalesuite" / "calibration"
    folder.mkdir(parents=True)
    (folder / f"{socket.gethostname()}-gloo-1threads.json").write_text(json.dumps(cal))
    recipe = make_recipe({"name": "ddp"}, world_size=2)
    (tmp_path / "run").mkdir()
    run_ranks(rank_task.train, 2, recipe, tmp_path / "run", timeout_s=120)
    predicted = read_json(tmp_path / "run" / "summary.json")["predicted"]
    assert predicted.get("step_time_s", 0) > 0, predicted
    assert "when predicted" in predicted["rate"]


def test_collectives_every_group_calls_at_once_on_shared_cores_are_not_hidden():
    """HSDP at 4 ranks on 2 cores: its shard groups (2 of 2 ranks) gather and reduce-scatter at the
    same point of the step, its replica groups all-reduce so, every rank in a collective at once;
    none computes while another waits, and no overlap rule hides them. FSDP over all 4 ranks (one
    group) keeps its rule's overlap."""
    fits = {k: {"alpha_s": ALPHA_S, "beta_bytes_per_s": BETA} for k in alpha_beta.MEASURED}
    cal = {**hand_calibration(fits=fits), "collectives_by_world": {"2": fits, "4": fits}}
    comm = {"all_gather": (10**6, 8), "reduce_scatter": (10**6, 4), "all_reduce": (10**6, 4)}

    def predicted(strategy):
        recipe = _recipe(strategy, 1, 4)
        profile = StepProfile(recipe.strategy.name, 4, {}, 0, 10**8, 64, comm_bytes={k: b for k, (b, _) in comm.items()},
                              comm_calls={k: c for k, (_, c) in comm.items()})
        options = timing.options_of(recipe)
        lockstep = {k for k in comm if groups.groups_in_lockstep(k, profile, cal, options)}
        return timing.predict_step_time(profile, cal, options), lockstep

    hsdp, lockstep = predicted({"name": "fsdp", "replicate": 2})
    assert lockstep == {"all_gather", "reduce_scatter", "all_reduce"}
    assert hsdp["exposed_comm_s"] == pytest.approx(hsdp["comm_s"])  # nothing hidden
    # the two shard groups share the 2 cores: each call waits twice as long for one; its bytes move as fast
    assert hsdp["comm_s_by_kind"]["all_gather"] == pytest.approx(
        alpha_beta.call_time_s("all_gather", 2, 10**6, 2 * ALPHA_S, BETA, calls=8))
    fsdp, lockstep = predicted({"name": "fsdp"})
    assert lockstep == set()  # one group of all the node's ranks
    assert fsdp["exposed_comm_s"] == pytest.approx(fsdp["comm_s"] - min(fsdp["comm_s"] / 2, fsdp["compute_s"]))


def test_a_groups_bytes_move_at_the_rate_timed_with_every_group_at_once():
    """HSDP at 4 ranks on 2 cores, with a calibration that also timed groups of 2 with both groups
    calling at once (``collectives_in_groups``): the shard groups' bytes move at that rate, their
    latency is still the alone fit's times the cores' ratio; over one group of all 4 ranks (FSDP)
    the grouped fits play no part."""
    fits = {k: {"alpha_s": ALPHA_S, "beta_bytes_per_s": BETA} for k in alpha_beta.MEASURED}
    together = {k: {"alpha_s": 3 * ALPHA_S, "beta_bytes_per_s": BETA / 1.5} for k in ("all_reduce", "all_gather", "reduce_scatter")}
    cal = {**hand_calibration(fits=fits), "collectives_by_world": {"2": fits, "4": fits},
           "collectives_in_groups": {"4": {"2": together}}}
    comm = {"all_gather": (10**6, 8), "reduce_scatter": (10**6, 4), "all_reduce": (10**6, 4)}

    def comm_s(strategy, calibration):
        recipe = _recipe(strategy, 1, 4)
        profile = StepProfile(recipe.strategy.name, 4, {}, 0, 10**8, 64, comm_bytes={k: b for k, (b, _) in comm.items()},
                              comm_calls={k: c for k, (_, c) in comm.items()})
        return timing.comm_time_s(profile, calibration, timing.options_of(recipe))

    hsdp = comm_s({"name": "fsdp", "replicate": 2}, cal)
    assert hsdp["all_gather"] == pytest.approx(alpha_beta.call_time_s("all_gather", 2, 10**6, 2 * ALPHA_S, BETA / 1.5, calls=8))
    without = comm_s({"name": "fsdp", "replicate": 2}, {k: v for k, v in cal.items() if k != "collectives_in_groups"})
    assert without["all_gather"] == pytest.approx(alpha_beta.call_time_s("all_gather", 2, 10**6, 2 * ALPHA_S, BETA, calls=8))
    assert comm_s({"name": "fsdp"}, cal) == comm_s({"name": "fsdp"}, {**cal, "collectives_in_groups": {}})


def test_a_pipelines_messages_on_shared_cores_cost_what_they_cost_with_every_rank_stepping():
    """Pipeline x dp, 4 ranks on 2 cores: a stage's sends wait for a core the other ranks hold, so they are priced
    with the fits timed at the node's 4 ranks, not at 2 ranks alone; with a core each (4 cores),
    as the pair was timed."""
    pair = {k: {"alpha_s": ALPHA_S, "beta_bytes_per_s": BETA} for k in alpha_beta.MEASURED}
    crowd = {k: {"alpha_s": 5 * ALPHA_S, "beta_bytes_per_s": BETA} for k in alpha_beta.MEASURED}
    comm = {"send": (10**5, 4), "recv": (10**5, 4)}
    recipe = _recipe({"name": "pipeline", "stages": 2, "dp": 2}, 1, 4)
    profile = StepProfile("pipeline", 4, {}, 0, 10**8, 64, comm_bytes={k: b for k, (b, _) in comm.items()},
                          comm_calls={k: c for k, (_, c) in comm.items()})
    options = timing.options_of(recipe)
    for cores, fit in ((2, crowd), (4, pair)):
        cal = {**hand_calibration(fits=pair, cores=cores), "collectives_by_world": {"2": pair, "4": crowd}}
        got = timing.comm_time_s(profile, cal, options)
        assert got["send"] == pytest.approx(alpha_beta.call_time_s("send", 2, 10**5, fit["send"]["alpha_s"], BETA, 4))
        assert got["recv"] == pytest.approx(got["send"])
