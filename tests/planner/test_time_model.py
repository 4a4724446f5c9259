"""The time model's terms (suite.planner.timing) on a hand-made calibration: each strategy's
overlap rule, the bubble, copies, the compute rate and its core share."""
from __future__ import annotations

import pytest

from suite.planner import pipeline_time, timing
from suite.strategies.ddp import DDP_SHARE
from tests.planner.hand_calibration import ALPHA_S, BETA, hand_calibration, step_profile


# ---- the time model ----------------------------------------------------------------------------

GPU = {"device": "cuda"}  # the overlap rules as written: a CPU with a rank on every core hides nothing


def test_ddp_half_of_the_all_reduce_hides_under_backward():
    grad_bytes = 4 * 10**6
    p = step_profile("ddp", 2, flops=10**9, comm={"all_reduce": (grad_bytes, 3)})
    t = timing.predict_step_time(p, hand_calibration(), GPU)
    assert t["compute_s"] == pytest.approx(0.1)  # 1e9 FLOPs / 1e10 FLOP/s (1 thread each: 2 ranks, 2 cores)
    comm = 3 * 2 * ALPHA_S + 1 * grad_bytes / BETA  # 3 calls x 2(N-1) α + 2(N-1)/N n/β
    assert t["comm_s"] == pytest.approx(comm)
    assert t["exposed_comm_s"] == pytest.approx(comm * (1 - DDP_SHARE))
    assert t["step_s"] == pytest.approx(0.1 + comm / 2)
    assert t["samples_per_s"] == pytest.approx(64 / t["step_s"])


def test_hidden_communication_is_capped_by_the_backward_window():
    p = step_profile("ddp", 2, flops=10**7, comm={"all_reduce": (10**9, 1)})  # 1 s of all-reduce, 1 ms of compute
    t = timing.predict_step_time(p, hand_calibration(), GPU)
    assert t["exposed_comm_s"] == pytest.approx(t["comm_s"] - 1e-3 * timing.BACKWARD_SHARE)


def test_allreduce_and_zero_1_2_expose_all_communication_unless_ranks_share_cores():
    comm = {"reduce_scatter": (10**6, 1), "all_gather": (10**6, 1)}
    expected = 2 * (3 * ALPHA_S + 0.75 * 10**6 / BETA)  # world 4: (N-1) α + (N-1)/N n/β each
    for strategy, options in (("allreduce", {}), ("zero", {"stage": 1}), ("zero", {"stage": 2})):
        t = timing.predict_step_time(step_profile(strategy, 4, comm=comm), hand_calibration(cores=4), options)
        assert t["comm_s"] == pytest.approx(expected) and t["exposed_comm_s"] == pytest.approx(expected)
    for strategy, options in (("zero", {"stage": 1}), ("zero", {"stage": 2})):
        # 4 ranks on 2 cores: while a rank waits in a collective another computes on its core,
        # whatever the strategy's rule: the waiting beyond its core share (1/2), up to the compute.
        shared = timing.predict_step_time(step_profile(strategy, 4, comm=comm), hand_calibration(cores=2), options)
        assert shared["exposed_comm_s"] == pytest.approx(expected - min(expected / 2, shared["compute_s"]))
        busy = timing.predict_step_time(step_profile(strategy, 4, flops=10**5, comm=comm), hand_calibration(cores=2), options)
        assert busy["exposed_comm_s"] == pytest.approx(expected - busy["compute_s"])


def test_allreduces_burst_after_backward_hides_nothing_where_ranks_share_cores():
    """The hand-written all-reduce's calls follow the backward on every rank at once
    (``Overlap.back_to_back``): at 4 ranks on 2 cores no rank computes while another waits in the
    burst, so nothing is hidden, with little compute or much."""
    comm = {"all_reduce": (10**6, 10)}
    for flops in (10**5, 10**9):
        t = timing.predict_step_time(step_profile("allreduce", 4, flops=flops, comm=comm), hand_calibration(cores=2), {})
        assert t["exposed_comm_s"] == pytest.approx(t["comm_s"]) and t["comm_s"] > 0
        assert t["step_s"] == pytest.approx(t["compute_s"] + t["comm_s"])


def test_allreduces_calls_back_to_back_cost_a_call_in_a_burst_and_ddps_a_call_between_compute():
    """The per-tensor all-reduce issues its calls one after another after backward: each costs what
    the calibration measured for a call in such a burst; DDP's buckets come between pieces of its
    backward: what a call costs between slices of compute as long as the step's over its calls."""
    fits = {k: {"alpha_s": ALPHA_S, "beta_bytes_per_s": BETA, "step_alpha": [[1e-3, 3 * ALPHA_S], [1e-2, 5 * ALPHA_S]],
                "burst_alpha": 10 * ALPHA_S} for k in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send")}
    calibration = hand_calibration(fits=fits)
    comm = {"all_reduce": (10**6, 10)}
    bandwidth = 10**6 / BETA  # world 2: 2(N-1)/N = 1
    flops = 10**8  # 10 ms at the hand-made 1-thread peak: 1 ms of compute per call
    back_to_back = timing.predict_step_time(step_profile("allreduce", 2, flops=flops, comm=comm), calibration, {})
    assert back_to_back["comm_s"] == pytest.approx(10 * 2 * 10 * ALPHA_S + bandwidth)
    between = timing.predict_step_time(step_profile("ddp", 2, flops=flops, comm=comm), calibration, {})
    assert between["comm_s"] == pytest.approx(10 * 2 * 3 * ALPHA_S + bandwidth)


def test_tensor_parallel_calls_inside_the_compute_hide_nothing_where_ranks_share_cores():
    """Tensor parallelism's all-reduces sit inside each layer's forward and backward
    (``Overlap.inside_compute``): priced as a call between slices of compute with every rank
    stepping, which holds another rank's compute on the shared core already, so nothing more is
    hidden at 4 ranks on 2 cores; a blocking call after the compute (ZeRO-2's) still is."""
    comm = {"all_reduce": (10**6, 12)}
    inside = timing.predict_step_time(step_profile("tensor", 4, comm=comm), hand_calibration(cores=2), {"device": "cpu"})
    assert inside["exposed_comm_s"] == pytest.approx(inside["comm_s"])
    assert inside["step_s"] == pytest.approx(inside["compute_s"] + inside["comm_s"])
    after = timing.predict_step_time(step_profile("zero", 4, comm=comm), hand_calibration(cores=2),
                                     {"stage": 2, "device": "cpu"})
    assert after["exposed_comm_s"] == pytest.approx(after["comm_s"] - min(after["comm_s"] / 2, after["compute_s"]))


def test_ddp_hides_nothing_where_ranks_share_cores():
    """4 ranks on 2 cores: DDP's buckets are reduced behind the rank's own backward (gloo's thread),
    so the rank is computing, not waiting, while they run; with every core busy nothing of them
    is hidden, neither by its rule nor by another rank's compute (a blocking strategy's are)."""
    comm = {"all_reduce": (10**6, 2)}
    shared = timing.predict_step_time(step_profile("ddp", 4, comm=comm), hand_calibration(cores=2), {"device": "cpu"})
    assert shared["exposed_comm_s"] == pytest.approx(shared["comm_s"])
    blocking = timing.predict_step_time(step_profile("zero", 4, comm=comm), hand_calibration(cores=2), {"stage": 2})
    assert blocking["exposed_comm_s"] == pytest.approx(blocking["comm_s"] / 2)


def test_a_strategys_own_cost_runs_on_the_ranks_share_of_a_core():
    """overhead_s (the strategy's code, timed as one rank on a core of its own) is paid at the
    rank's core share, as its compute is: doubled at 4 ranks on 2 cores."""
    timed = {"flops_per_s": 1e10, "threads": 1, "timed": "when predicted", "rank_batch": 32, "strategy": "fsdp",
             "overhead_s": 0.01}
    cal = hand_calibration(models={"m": timed})
    alone = timing.predict_step_time(step_profile("fsdp", 2), cal, {"model": "m", "device": "cpu"})
    assert alone["compute_s"] == pytest.approx(10**9 / 1e10 + 0.01)
    shared = timing.predict_step_time(step_profile("fsdp", 4), cal, {"model": "m", "device": "cpu"})
    assert shared["compute_s"] == pytest.approx(10**9 / 0.5e10 + 0.02)


def test_a_rank_timed_at_its_own_world_is_its_compute_whatever_its_flops():
    """A tensor-parallel rank timed as rank 0 of its world (model_time.at_world: rank_step_s)
    computes what that step took, on its share of a core, not its FLOPs at the model's rate plus
    the one-rank overhead: the split layers' replicated rest is in the step, in no FLOP count."""
    timed = {"flops_per_s": 1e10, "threads": 1, "timed": "when predicted", "rank_batch": 32, "strategy": "tensor",
             "overhead_s": 0.01, "rank_step_s": 0.3}
    cal = hand_calibration(models={"m": timed})
    alone = timing.predict_step_time(step_profile("tensor", 2), cal, {"model": "m", "device": "cpu"})
    assert alone["compute_s"] == pytest.approx(0.3) and "own world" in alone["rate"]
    shared = timing.predict_step_time(step_profile("tensor", 4), cal, {"model": "m", "device": "cpu"})
    assert shared["compute_s"] == pytest.approx(0.6)  # 4 ranks on 2 cores: half a core each
    other = timing.predict_step_time(step_profile("fsdp", 2), cal, {"model": "m", "device": "cpu"})
    assert other["compute_s"] == pytest.approx(10**9 / 1e10)  # another strategy's timing is not its


def test_zero3_and_fsdp_hide_half_their_gathers_under_the_whole_step():
    comm = {"all_gather": (2 * 10**6, 2), "reduce_scatter": (10**6, 1)}
    for strategy, options in (("zero", {"stage": 3}), ("fsdp", {})):
        t = timing.predict_step_time(step_profile(strategy, 2, comm=comm), hand_calibration(), {**options, **GPU})
        assert t["exposed_comm_s"] == pytest.approx(t["comm_s"] / 2)
        # On a CPU whose every core runs a rank, gloo's threads take their time from compute.
        cpu = timing.predict_step_time(step_profile(strategy, 2, comm=comm), hand_calibration(), {**options, "device": "cpu"})
        assert cpu["exposed_comm_s"] == pytest.approx(cpu["comm_s"])
        # With more ranks than cores (4 on 2), one rank computes while another waits: the rule holds.
        more = timing.predict_step_time(step_profile(strategy, 4, comm=comm), hand_calibration(), {**options, "device": "cpu"})
        assert more["exposed_comm_s"] == pytest.approx(more["comm_s"] / 2)
        # launch.device auto: the calibration's device (gloo: a CPU).
        auto = timing.predict_step_time(step_profile(strategy, 2, comm=comm), hand_calibration(), {**options, "device": "auto"})
        assert auto["exposed_comm_s"] == pytest.approx(auto["comm_s"])


def test_fsdp2s_copies_take_their_bytes_at_the_copy_rate_and_a_share_of_the_cores():
    cal = hand_calibration()
    cal["compute"]["copy_bytes_per_s"] = 2e9
    p = step_profile("fsdp", 2, comm={"all_gather": (2 * 10**6, 2), "reduce_scatter": (10**6, 1)})
    p.copy_bytes = 4 * 10**6
    t = timing.predict_step_time(p, cal, {"device": "cpu"})
    assert t["copy_s"] == pytest.approx(2e-3)  # 4 MB at 2 GB/s: a core each
    assert t["step_s"] == pytest.approx(t["compute_s"] + 2e-3 + t["exposed_comm_s"])
    p4 = step_profile("fsdp", 4)
    p4.copy_bytes = 4 * 10**6
    assert timing.predict_step_time(p4, cal, {"device": "cpu"})["copy_s"] == pytest.approx(4e-3)  # half a core each
    del cal["compute"]["copy_bytes_per_s"]  # a calibration from before the copy rate: no copy time
    assert timing.predict_step_time(p, cal, {"device": "cpu"})["copy_s"] == 0.0


def test_pipeline_bubble_and_sends():
    comm = {"send": (10**6, 4), "recv": (10**6, 4)}
    t = timing.predict_step_time(step_profile("pipeline", 2, comm=comm), hand_calibration(), {"stages": 2, "chunks": 4})
    assert t["bubble"] == pytest.approx(1 / 5)  # (K-1)/(M+K-1)
    sends = 2 * (4 * ALPHA_S + 10**6 / BETA)  # recv borrows send's fit
    assert t["step_s"] == pytest.approx(0.1 / (1 - 1 / 5) + sends)


def test_an_unbalanced_pipelines_bubble_is_the_lighter_stages_fill_and_drain():
    """The busiest stage sets the pace: (M-1) of its chunks plus one chunk of every stage. A
    stage doing 3/4 of the compute (C = 0.1 s, M = 4) steps in C·3/4 + C/(4·3/4) = 0.1083 s, not the
    balanced C·5/4; balanced or unknown shares give (K-1)/(M+K-1)."""
    comm = {"send": (10**6, 4), "recv": (10**6, 4)}
    p = step_profile("pipeline", 2, comm=comm)
    p.stage_share = 0.75
    t = timing.predict_step_time(p, hand_calibration(), {"stages": 2, "chunks": 4})
    sends = 2 * (4 * ALPHA_S + 10**6 / BETA)
    # the lighter stage idles 2/3 of the busiest's 0.1 s: far more than its messages take, all absorbed
    assert t["step_s"] == pytest.approx(0.1 * (3 / 4 + 1 / 3))
    assert t["messages_ready_s"] == pytest.approx(sends)
    assert pipeline_time.pipeline_bubble(2, 4, 0.5) == pytest.approx(1 / 5)
    assert pipeline_time.pipeline_bubble(4, 8, None) == pytest.approx(3 / 11)
    assert pipeline_time.pipeline_bubble(2, 1, 0.5) == pytest.approx(1 / 2)  # no chunks: the stages run one after another
    assert pipeline_time.pipeline_bubble(1, 4, None) == 0.0


def test_the_busiest_stage_waits_for_its_messages_as_much_as_its_neighbours_keep_pace():
    """A stage's point-to-point calls cost it their time less its slower neighbour's idle time
    (the busiest stage's step times 1 - ``neighbour_ratio``): in full where stages are balanced,
    nothing where the neighbours idle longer than the messages take, and in full with more ranks
    than cores, where a neighbour's idle time goes to another rank's compute."""
    assert pipeline_time.neighbour_ratio([0.05, 0.05], 2) == 1.0
    assert pipeline_time.neighbour_ratio([0.08, 0.02], 2) == pytest.approx(0.25)
    # the busiest stage in the middle: the slower of its two neighbours; stages beyond them do not count
    assert pipeline_time.neighbour_ratio([0.09, 0.02, 0.1, 0.01], 4) == pytest.approx(0.2)
    assert pipeline_time.neighbour_ratio(None, 4, 0.25) == 1.0  # balanced shares of the FLOPs
    assert pipeline_time.neighbour_ratio(None, 2, 0.8) == pytest.approx(0.25)
    assert pipeline_time.neighbour_ratio(None, 1) == 1.0
    comm = {"send": (10**6, 4), "recv": (10**6, 4)}
    p = step_profile("pipeline", 2, comm=comm)
    p.stage_share = 0.8
    own_cores = timing.predict_step_time(p, hand_calibration(), {"stages": 2, "chunks": 4})
    balanced = timing.predict_step_time(step_profile("pipeline", 2, comm=comm), hand_calibration(), {"stages": 2, "chunks": 4})
    assert balanced["messages_ready_s"] == 0.0 and balanced["exposed_comm_s"] == pytest.approx(balanced["comm_s"])
    assert own_cores["exposed_comm_s"] == 0.0  # 2.8 ms of messages, 75 ms of the neighbour idle
    big = {"send": (10**8, 4), "recv": (10**8, 4)}  # 0.2 s of messages: 75 ms of them absorbed
    p = step_profile("pipeline", 2, comm=big)
    p.stage_share = 0.8
    slow = timing.predict_step_time(p, hand_calibration(), {"stages": 2, "chunks": 4})
    assert slow["compute_s"] == pytest.approx(0.1) and slow["messages_ready_s"] == pytest.approx(0.075)
    assert slow["exposed_comm_s"] == pytest.approx(slow["comm_s"] - 0.075)
    p4 = step_profile("pipeline", 4, comm=comm)
    p4.stage_share = 0.8
    shared = timing.predict_step_time(p4, hand_calibration(), {"stages": 4, "chunks": 4})  # 4 ranks, 2 cores
    assert shared["messages_ready_s"] == 0.0 and shared["exposed_comm_s"] == pytest.approx(shared["comm_s"])


def test_a_middle_stage_sends_and_receives_both_ways():
    """The profile counts the first stage's messages (activations out, gradients in); a stage
    between two others receives and sends both, twice as many, and sets the pace where it is the
    busiest (or where nothing says which is: balanced)."""
    assert pipeline_time.stage_messages_factor([0.01, 0.03, 0.01, 0.01], 4) == 2
    assert pipeline_time.stage_messages_factor([0.03, 0.01, 0.01, 0.01], 4) == 1
    assert pipeline_time.stage_messages_factor([0.01, 0.01, 0.01, 0.03], 4) == 1
    assert pipeline_time.stage_messages_factor(None, 4) == 2
    assert pipeline_time.stage_messages_factor(None, 2) == pipeline_time.stage_messages_factor([0.01, 0.03], 2) == 1
    comm = {"send": (10**6, 4), "recv": (10**6, 4)}
    cal = hand_calibration()
    four = timing.predict_step_time(step_profile("pipeline", 4, comm=comm), cal, {"stages": 4, "chunks": 4})
    alone = timing.comm_time_s(step_profile("pipeline", 4, comm=comm), cal, {"name": "pipeline", "stages": 4})
    assert four["comm_s_by_kind"]["send"] == pytest.approx(2 * alone["send"])
    assert four["comm_s"] == pytest.approx(2 * sum(alone.values()))


def test_pipeline_stages_sharing_cores_lend_them_in_the_bubble():
    """4 stages on 2 cores (each rank's compute 0.1 s with all four computing at once, half a
    core each): a stage idle in the bubble frees its core, so the step is the larger of the
    critical path at a whole core (0.05 s / (1 - bubble)) and the node's work over its cores;
    with a core or device each, the bubble is charged in full."""
    bubble = pipeline_time.pipeline_bubble(4, 4, None)
    assert bubble == pytest.approx(3 / 7)
    assert pipeline_time.pipelined_compute_s(0.1, bubble, 0.5, 4) == pytest.approx(0.1)  # balanced: the node's work
    assert pipeline_time.pipelined_compute_s(0.1, bubble, 1.0, 4) == pytest.approx(0.1 / (4 / 7))
    # one stage doing 90 % of the work runs nearly alone: the critical path at a whole core
    heavy = pipeline_time.pipeline_bubble(4, 4, 0.9)
    assert pipeline_time.pipelined_compute_s(0.1, heavy, 0.5, 4, 0.9) == pytest.approx(0.05 / (1 - heavy))
    assert pipeline_time.pipelined_compute_s(0.1, 0.0, 0.5, 1) == pytest.approx(0.1)  # no pipeline axis


def test_a_pipelines_model_is_timed_in_its_chunks_and_other_strategies_at_the_accumulation_batch():
    from suite.planner import model_time
    from tests.parity import make_recipe

    pipe = make_recipe({"name": "pipeline", "stages": 2, "micro_batches": 4}, world_size=2)
    one = model_time.one_rank_recipe(pipe)
    assert one.strategy.name == "single" and one.training.grad_accumulation == 4
    assert one.training.batch_size == pipe.layout().accumulation_batch
    ddp = model_time.one_rank_recipe(make_recipe({"name": "ddp"}, world_size=2))
    assert ddp.training.grad_accumulation == 1
    two = make_recipe({"name": "pipeline", "stages": 2, "micro_batches": 2}, world_size=2)
    assert model_time.one_rank_recipe(two).training.grad_accumulation == 2
    assert model_time.cache_key(pipe, 1) != model_time.cache_key(two, 1)  # same batch, other passes
    # stages unset: the degree follows the world size, and a 4-stage split is timed as its own
    deep = {"name": "mlp", "hidden": [16, 16, 16]}
    two_stages = make_recipe({"name": "pipeline", "micro_batches": 4}, world_size=2, model=deep)
    four_stages = make_recipe({"name": "pipeline", "micro_batches": 4}, world_size=4, model=deep)
    assert two_stages.strategy == four_stages.strategy
    assert model_time.cache_key(two_stages, 1, stages=True) != model_time.cache_key(four_stages, 1, stages=True)


def test_a_pipeline_engine_whose_stages_are_not_timed_one_by_one_is_timed_as_one_stage_of_one_rank():
    """DeepSpeed's pipeline engine (no stage_schedule for stage_time): its own engine at one stage,
    its micro-batches kept, so that what its schedule costs a step is timed (rate_jobs: a job of
    its own); the suite's pipeline keeps its stages' timing."""
    from suite.planner import model_rate, model_time
    from tests.parity import make_recipe

    ds = make_recipe({"name": "ds_pipeline", "stages": 2, "micro_batches": 2}, world_size=4, precision="fp32")
    one = model_time.one_rank_recipe(ds, own_strategy=True)
    assert (one.strategy.name, one.strategy.stages, one.strategy.micro_batches, one.world_size) == ("ds_pipeline", 1, 2, 1)
    assert one.training.batch_size == ds.layout().accumulation_batch and one.training.grad_accumulation == 1
    assert model_time.one_rank_recipe(ds).strategy.name == "single"
    calibration = {"compute": {"cores": 2}}
    assert [(j.own_strategy, j.stages) for j in model_rate.rate_jobs(calibration, ds, 4)] == [(False, False), (True, False)]
    pipe = make_recipe({"name": "pipeline", "stages": 2, "micro_batches": 2}, world_size=2)
    assert model_time.one_rank_recipe(pipe, own_strategy=True).strategy.name == "single"
    assert [(j.own_strategy, j.stages) for j in model_rate.rate_jobs(calibration, pipe, 2)] == [(False, False), (False, True)]


def test_rate_uses_threads_per_rank_core_share_and_the_models_efficiency():
    cal = hand_calibration(models={"m-1": {"flops_per_s": 2.5e9, "threads": 1}})
    assert timing.compute_rate(cal, 1)[0] == 1.6e10  # one rank: both cores
    assert timing.compute_rate(cal, 2)[0] == 1e10  # two ranks: a core each
    assert timing.compute_rate(cal, 4)[0] == 0.5e10  # four ranks on two cores: half a core each
    assert timing.compute_rate(cal, 1, "m-1")[0] == pytest.approx(1.6e10 * 0.25)  # 2.5e9 of 1e10 at 1 thread
    assert timing.compute_rate(cal, 1, "other")[0] == 1.6e10
    # launch.cpus_per_task decides the threads, as in the ranks (suite.train.dist): one rank on one
    # of two cores computes at the 1-thread rate, not both cores'
    assert timing.compute_rate(cal, 1, cpus_per_task=1)[0] == 1e10
    assert timing.compute_rate(cal, 1, "m-1", cpus_per_task=1)[0] == pytest.approx(2.5e9)  # timed at 1 thread
    # two ranks of 2 threads each on 2 cores share them: half the 2-thread rate each
    assert timing.compute_rate(cal, 2, cpus_per_task=2)[0] == pytest.approx(0.8e10)


def test_the_prediction_options_carry_the_recipes_cpus_per_task():
    from tests.parity import make_recipe

    recipe = make_recipe({"name": "ddp"}, world_size=2, launch={"cpus_per_task": 1})
    assert timing.options_of(recipe)["cpus_per_task"] == 1
    assert timing.options_of(make_recipe({"name": "ddp"}, world_size=2))["cpus_per_task"] is None


def test_single_rank_has_no_communication_cost():
    t = timing.predict_step_time(step_profile("single", 1, comm={"all_reduce": (10**6, 1)}), hand_calibration())
    assert t["comm_s"] == 0 and t["step_s"] == pytest.approx(10**9 / 1.6e10)


def test_every_stages_parameter_gather_lies_on_a_pipelines_path():
    """Stages data-parallel through FSDP each gather their parameters at their first chunk's
    forward, which waits for the stage before: the step waits for every stage's gather, one after
    another, and for the first stage's reduce-scatter alone (the profile counts the first stage's)."""
    assert [pipeline_time.path_calls_factor("all_gather", None, k) for k in (2, 4)] == [2, 4]
    assert pipeline_time.path_calls_factor("reduce_scatter", None, 4) == pipeline_time.path_calls_factor("all_gather@data", None, 4) == 1
    assert pipeline_time.path_calls_factor("send", [0.01, 0.03, 0.01, 0.01], 4) == 2  # stage_messages_factor
    comm = {"all_gather": (10**6, 1), "reduce_scatter": (10**6, 1), "send": (10**5, 4), "recv": (10**5, 4)}
    cal = hand_calibration()
    profile = step_profile("pipeline", 4, comm=comm)
    two = timing.predict_step_time(profile, cal, {"stages": 2, "chunks": 4})
    alone = timing.comm_time_s(profile, cal, {"name": "pipeline", "stages": 2})
    assert two["comm_s_by_kind"]["all_gather"] == pytest.approx(2 * alone["all_gather"])
    assert two["comm_s_by_kind"]["reduce_scatter"] == pytest.approx(alone["reduce_scatter"])
