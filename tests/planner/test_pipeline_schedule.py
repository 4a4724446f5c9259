"""A pipeline step played out op by op (``suite.planner.pipeline_schedule``): the textbook bubble
without latency, GPipe paying each message's rendezvous on its path where 1F1B fuses them, an
unbalanced split set by its busiest stage, and the time model predicting GPipe through it."""
import pytest

from suite import recipe as recipes
from suite.planner import pipeline_schedule, timing
from tests.planner.hand_calibration import ALPHA_S, BETA, hand_calibration, step_profile

RAW = {"name": "t", "model": {"name": "mlp", "hidden": [64, 64]},
       "data": {"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 256, "n_val": 32},
       "optimizer": {"name": "adam", "lr": 0.001}, "training": {"epochs": 1, "batch_size": 64, "seed": 0},
       "launch": {"tasks_per_node": 2}, "tracking": {"wandb": "disabled"}}


@pytest.mark.parametrize("schedule", pipeline_schedule.SCHEDULES)
@pytest.mark.parametrize("stages,chunks", [(2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (8, 8)])
def test_without_latency_balanced_stages_step_in_the_textbook_m_plus_k_minus_1_chunks(schedule, stages, chunks):
    r = pipeline_schedule.simulate(schedule, [1.0] * stages, [2.0] * stages, chunks, 0.0)
    assert r["step_s"] == pytest.approx((chunks + stages - 1) * 3.0)
    # every activation and gradient crosses each boundary once per chunk
    assert r["messages"] == 2 * chunks * (stages - 1)


def test_gpipe_pays_a_rendezvous_per_message_where_1f1b_fuses_them():
    """Two stages of 0.1 + 0.2 ms chunks, messages of 0.3 ms each way (a receive's notice to the
    sender, then the data). GPipe posts each receive just after its previous chunk, so every
    message but the first of each direction costs both on its receiver's path: the last stage
    receives its activations at 0.6, 1.3, 2.0 and 2.7 ms, runs its backwards to 3.6 ms, and the
    first stage receives the gradients at 3.3, 4.1, 4.9 and 5.7 ms and ends at 5.9 ms. 1F1B
    overlaps them with its neighbour's work. Measured on an autoencoder (2 stages, 4 chunks, one
    rank per core): GPipe 6.2-7.2 ms, 1F1B 4.0-5.1 ms."""
    f, b, latency = [1e-4, 1e-4], [2e-4, 2e-4], 3e-4
    gpipe = pipeline_schedule.simulate("gpipe", f, b, 4, latency)
    assert gpipe["step_s"] == pytest.approx(5.9e-3)
    assert gpipe["stage_end_s"] == pytest.approx([5.9e-3, 5.7e-3])
    assert pipeline_schedule.simulate("1f1b", f, b, 4, latency)["step_s"] < 5.0e-3
    # a notice with no data in it (0.1 ms) quicker than the data: 0.2 ms less per message but
    # the two whose sends come after their notices
    assert pipeline_schedule.simulate("gpipe", f, b, 4, latency, notice_s=1e-4)["step_s"] == pytest.approx(4.5e-3)


def test_a_message_that_leaves_while_its_sender_computes_costs_the_busy_price():
    """Balanced stages of 1 + 2 ms chunks: the first stage sends each activation and goes on to
    its next chunk, so the second and third leave while it computes (the first as its next chunk
    starts, the last after its forwards end); the gradients likewise, the second and third while
    the last stage computes its next backward. A busy sender's price (its communication waiting
    for the core its compute holds), 0.4 ms dearer, lengthens the step by those four; the same
    price idle or busy changes nothing."""
    f, b = [1e-3, 1e-3], [2e-3, 2e-3]
    idle = pipeline_schedule.simulate("gpipe", f, b, 4, 1e-4, notice_s=1e-5)
    same = pipeline_schedule.simulate("gpipe", f, b, 4, 1e-4, notice_s=1e-5, busy_latency_s=1e-4)
    busy = pipeline_schedule.simulate("gpipe", f, b, 4, 1e-4, notice_s=1e-5, busy_latency_s=5e-4)
    assert same["step_s"] == pytest.approx(idle["step_s"])
    assert busy["step_s"] == pytest.approx(idle["step_s"] + 4 * 4e-4)


def test_an_unbalanced_split_steps_at_its_busiest_stages_pace():
    """A first stage doing 3/4 of the compute (chunks of 0.75 s) beside one of 0.25 s: its M
    chunks plus the light stage's fill and drain, as the bubble formula says, and messages the
    light stage's idle time absorbs except where they sit between the heavy stage's chunks."""
    r = pipeline_schedule.simulate("gpipe", [0.25, 0.25 / 3], [0.5, 0.5 / 3], 4, 0.0)
    assert r["step_s"] == pytest.approx(4 * 0.75 + 0.25)
    assert r["stage_busy_s"] == pytest.approx([3.0, 1.0])
    with pytest.raises(ValueError, match="simulated are"):
        pipeline_schedule.simulate("interleaved", [1.0, 1.0], [1.0, 1.0], 2, 0.0)


def _options(schedule: str, chunks: int = 4) -> dict:
    recipe = recipes.validate({**RAW, "strategy": {"name": "pipeline", "schedule": schedule, "micro_batches": chunks}})
    return timing.options_of(recipe)


def test_the_time_model_predicts_gpipe_through_its_schedule_and_1f1b_by_the_bubble_formula():
    """GPipe at a rank per core: the simulated step with its stages' compute and each message's
    latency from the calibration (alpha + bytes / beta), nothing priced twice. 1F1B, whose fused
    messages cost less than the rule gives them (``pipeline_schedule.PREDICTED``), and any
    pipeline with more ranks than cores, keep the bubble formula."""
    comm = {"send": (4 * 10**5, 4), "recv": (4 * 10**5, 4)}
    cal = hand_calibration()
    gpipe = timing.predict_step_time(step_profile("pipeline", 2, comm=comm), cal, _options("gpipe"))
    compute = gpipe["compute_s"]
    latency = ALPHA_S + 10**5 / BETA
    expected = pipeline_schedule.simulate("gpipe", [compute / 4 / 3] * 2, [compute / 4 * 2 / 3] * 2, 4, latency,
                                          notice_s=ALPHA_S)["step_s"]
    assert gpipe["schedule_simulated_s"] == pytest.approx(expected)
    assert gpipe["step_s"] == pytest.approx(expected)  # its messages are in the simulated step, not added again
    assert gpipe["exposed_comm_s"] == pytest.approx(0.0)
    one_f_one_b = timing.predict_step_time(step_profile("pipeline", 2, comm=comm), cal, _options("1f1b"))
    assert "schedule_simulated_s" not in one_f_one_b and one_f_one_b["bubble"] == pytest.approx(1 / 5)
    shared = timing.predict_step_time(step_profile("pipeline", 4, comm=comm), cal,
                                      {**_options("gpipe"), "stages": 4, "ranks_per_node": 4})
    assert "schedule_simulated_s" not in shared  # 4 ranks on 2 cores: a stage's idle time is another's compute
