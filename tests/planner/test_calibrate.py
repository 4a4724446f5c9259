"""python -m suite.calibrate (alpha-beta fits of gloo collectives at world 2), a run's recorded
prediction and the report's predicted-vs-measured table. The time model's terms:
tests/planner/test_time_model.py."""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from suite.calibrate import __main__ as calibrate_command, measure as calibrate
from suite.planner import alpha_beta, calibration, timing

from tests.planner.hand_calibration import ALPHA_S, BETA, hand_calibration, step_profile


# ---- the fit -------------------------------------------------------------------------------

@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("kind", alpha_beta.MEASURED)
def test_fit_recovers_alpha_and_beta_from_times_the_formula_made(kind, world):
    alpha_s, beta = 3e-5, 2.5e9
    points = [(n, alpha_beta.call_time_s(kind, world, n, alpha_s, beta)) for n in calibrate.sizes(4096, 64 * 2**20)]
    f = alpha_beta.fit(kind, world, points)
    assert f["method"] == "least squares (relative)"
    assert math.isclose(f["alpha_s"], alpha_s, rel_tol=1e-6) and math.isclose(f["beta_bytes_per_s"], beta, rel_tol=1e-6)
    assert f["max_relative_error"] < 1e-6


def test_fit_of_noisy_times_stays_positive_and_robust_to_one_slow_point():
    alpha_s, beta = 2e-4, 1e9
    points = [(n, alpha_beta.call_time_s("all_reduce", 2, n, alpha_s, beta)) for n in calibrate.sizes(4096, 16 * 2**20)]
    points[0] = (points[0][0], points[0][1] * 30)  # a busy spell at the smallest size: least squares' intercept goes wrong
    points[1] = (points[1][0], points[1][1] * 0.2)
    f = alpha_beta.fit("all_reduce", 2, points)
    assert f["alpha_s"] > 0 and f["beta_bytes_per_s"] > 0
    assert math.isclose(f["beta_bytes_per_s"], beta, rel_tol=0.2), f


def test_the_bandwidth_is_the_large_messages_even_where_small_ones_pass_faster():
    """Measured on the local Slurm's 1 Gbit/s link (slurm/start.sh --link 1gbit): tbf's bucket lets
    the first 500 KB of a message through at once, and two small calls were held up (3.7 ms). The 1
    and 4 MiB calls measured the link, 125 MB/s less framing; one line on relative error over all
    sizes fitted 243 MB/s, which the largest message's time now bounds."""
    points = [(4096, 0.00370), (16384, 0.000431), (65536, 0.00368), (262144, 0.000974), (1048576, 0.00760),
              (4194304, 0.0349)]
    f = alpha_beta.fit("all_reduce", 2, points)
    assert 105e6 < f["beta_bytes_per_s"] < 125e6, f
    assert 1e-4 < f["alpha_s"] < 3e-4, f


def test_a_calls_bandwidth_is_that_of_the_timed_messages_nearest_its_size():
    """As gloo's all_gather on the Intel VM's loopback: 1-16 MiB at one bandwidth, 64 MiB at half
    of it. The line is held to the largest message's bandwidth; a 4.5 MB call gets the bandwidth
    its neighbours reached, a 64 MiB one the slow one, and sizes between are interpolated."""
    alpha_s, beta = 2e-4, 7e8
    points = [(n, alpha_beta.call_time_s("all_gather", 2, n, alpha_s, beta)) for n in calibrate.sizes(4096, 16 * 2**20)]
    big = 64 * 2**20
    points.append((big, alpha_beta.call_time_s("all_gather", 2, big, alpha_s, beta / 2)))
    f = alpha_beta.fit("all_gather", 2, points)
    assert f["beta_bytes_per_s"] < 0.6 * beta  # the line: held to the largest message's
    assert alpha_beta.beta_at(f, "all_gather", 4.5e6) == pytest.approx(beta, rel=0.02)
    assert alpha_beta.beta_at(f, "all_gather", big) == pytest.approx(beta / 2, rel=0.02)
    assert alpha_beta.beta_at(f, "all_gather", 4 * big) == alpha_beta.beta_at(f, "all_gather", big)  # held at the ends
    assert beta / 2 < alpha_beta.beta_at(f, "all_gather", 32 * 2**20) < beta
    assert alpha_beta.beta_at(f, "all_gather", 100) == alpha_beta.beta_at(f, "all_gather", 2**20)  # latency-bound sizes
    # a fit with no messages (a preset's) has its line's bandwidth only; a borrowed kind its lender's messages
    assert alpha_beta.beta_at({**f, "points": []}, "all_gather", 4.5e6) == f["beta_bytes_per_s"]
    assert alpha_beta.beta_at(f, "gather", 4.5e6) == alpha_beta.beta_at(f, "all_gather", 4.5e6)


def test_a_kinds_calls_are_priced_size_by_size_not_at_their_mean():
    """ZeRO's 4-byte norm all-reduce beside a 64 MiB gradient all-reduce: their mean, 32 MiB, has
    a bandwidth between the small and large messages'; the calls' bytes are the large one's and
    take its bandwidth. Without sizes (the analytic rule), the mean's."""
    alpha_s, beta = 2e-4, 7e8
    points = [(n, alpha_beta.call_time_s("all_reduce", 2, n, alpha_s, beta)) for n in calibrate.sizes(4096, 16 * 2**20)]
    big = 64 * 2**20
    points.append((big, alpha_beta.call_time_s("all_reduce", 2, big, alpha_s, beta / 2)))
    f = alpha_beta.fit("all_reduce", 2, points)
    at_mean = alpha_beta.beta_at(f, "all_reduce", (big + 4) / 2)
    assert at_mean > 1.2 * alpha_beta.beta_at(f, "all_reduce", big)
    assert alpha_beta.beta_of_sizes(f, "all_reduce", {"4": 1, str(big): 1}, (big + 4) / 2) == \
        pytest.approx(alpha_beta.beta_at(f, "all_reduce", big), rel=1e-6)
    assert alpha_beta.beta_of_sizes(f, "all_reduce", None, (big + 4) / 2) == at_mean
    # two sizes that both carry bytes: their times add up
    mixed = alpha_beta.beta_of_sizes(f, "all_reduce", {str(2**20): 2, str(big): 1}, 0)
    time = 2 * 2**20 / alpha_beta.beta_at(f, "all_reduce", 2**20) + big / alpha_beta.beta_at(f, "all_reduce", big)
    assert mixed == pytest.approx((2 * 2**20 + big) / time)


def test_formulas_scale_with_world_size_as_stated():
    n = 8 * 2**20
    assert alpha_beta.call_time_s("all_reduce", 4, n, ALPHA_S, BETA) == pytest.approx(6 * ALPHA_S + 1.5 * n / BETA)
    assert alpha_beta.call_time_s("all_gather", 4, n, ALPHA_S, BETA) == pytest.approx(3 * ALPHA_S + 0.75 * n / BETA)
    assert alpha_beta.call_time_s("reduce_scatter", 8, n, ALPHA_S, BETA) == pytest.approx(7 * ALPHA_S + 7 / 8 * n / BETA)
    assert alpha_beta.call_time_s("broadcast", 5, n, ALPHA_S, BETA) == pytest.approx(3 * (ALPHA_S + n / BETA))
    assert alpha_beta.call_time_s("send", 16, n, ALPHA_S, BETA, calls=2) == pytest.approx(2 * ALPHA_S + n / BETA)
    assert alpha_beta.call_time_s("all_reduce", 1, n, ALPHA_S, BETA) == 0.0


def test_a_call_in_a_step_costs_the_larger_of_alpha_and_the_in_step_cost_at_the_steps_slice():
    f = alpha_beta.fit("all_reduce", 2, [(4096, 2e-4), (2**20, 1e-3), (2**22, 3e-3)],
                       in_step=[[2.5e-3, 3e-3], [5e-4, 1e-3]])
    assert f["step_alpha"] == [[5e-4, 1e-3 / 2], [2.5e-3, 3e-3 / 2]]  # sorted by slice, per a(2) = 2
    assert alpha_beta.step_alpha(f) == f["alpha_s"]  # no slice given: the fit's alpha
    assert alpha_beta.step_alpha(f, 1e-4) == pytest.approx(5e-4)  # held at the ends
    assert alpha_beta.step_alpha(f, 1e-2) == pytest.approx(1.5e-3)
    middle = math.sqrt(5e-4 * 2.5e-3)  # halfway on log(slice)
    assert alpha_beta.step_alpha(f, middle) == pytest.approx((5e-4 + 1.5e-3) / 2)
    low = {**f, "step_alpha": [[1e-3, f["alpha_s"] / 10]]}
    assert alpha_beta.step_alpha(low, 1e-3) == f["alpha_s"]  # never below the fit's alpha


def test_calls_back_to_back_cost_the_larger_of_alpha_and_a_call_in_a_burst():
    points, in_step = [(4096, 2e-4), (2**20, 1e-3), (2**22, 3e-3)], [[2.5e-3, 3e-3], [5e-4, 1e-3]]
    f = alpha_beta.fit("all_reduce", 2, points, in_step=in_step, burst=4e-3)
    assert f["burst_alpha"] == pytest.approx(4e-3 / 2)  # per a(2) = 2
    assert alpha_beta.burst_alpha(f) == pytest.approx(2e-3)
    assert alpha_beta.burst_alpha({**f, "burst_alpha": f["alpha_s"] / 10}) == f["alpha_s"]  # never below alpha
    older = alpha_beta.fit("all_reduce", 2, points, in_step=in_step)  # a calibration from before bursts
    assert "burst_alpha" not in older and alpha_beta.burst_alpha(older) == pytest.approx(5e-4)  # the shortest slice's


def test_a_call_in_a_longer_burst_costs_what_the_burst_lengths_timed_say_on_log_calls():
    """Bursts of 8 and 256 calls timed (with a core per rank a call costs less in a long burst): a
    step's n calls back to back each cost the burst's price at n, linear in log(n), held at the
    ends; a calibration with one burst length prices every length at it."""
    points, in_step = [(4096, 2e-4), (2**20, 1e-3), (2**22, 3e-3)], [[2.5e-3, 3e-3], [5e-4, 1e-3]]
    f = alpha_beta.fit("all_reduce", 2, points, in_step=in_step, burst={8: 4e-3, 256: 1e-3})
    assert f["burst_alpha"] == pytest.approx(2e-3) and f["burst_alpha_by_calls"] == [[8, 2e-3], [256, 5e-4]]
    assert alpha_beta.burst_alpha(f, 8) == pytest.approx(2e-3)
    assert alpha_beta.burst_alpha(f, 4) == pytest.approx(2e-3)  # held at the shortest
    assert alpha_beta.burst_alpha(f, 1000) == pytest.approx(5e-4)  # and at the longest
    assert alpha_beta.burst_alpha(f, math.sqrt(8 * 256)) == pytest.approx((2e-3 + 5e-4) / 2)  # halfway on log(calls)
    assert alpha_beta.burst_alpha(f) == pytest.approx(2e-3)  # no length given: the shortest burst's
    assert alpha_beta.burst_alpha({**f, "alpha_s": 1e-3}, 256) == 1e-3  # never below alpha
    one = alpha_beta.fit("all_reduce", 2, points, in_step=in_step, burst=4e-3)  # one length (before the long one)
    assert "burst_alpha_by_calls" not in one and alpha_beta.burst_alpha(one, 215) == pytest.approx(2e-3)
    # The time model prices a per-tensor all-reduce's calls at the burst of their number.
    fits = {k: {"alpha_s": 1e-6, "beta_bytes_per_s": BETA} for k in alpha_beta.MEASURED}
    fits["all_reduce"] = {**f, "alpha_s": 1e-6}
    for calls, alpha in ((8, 2e-3), (256, 5e-4)):
        profile = step_profile("allreduce", 2, comm={"all_reduce": (0, calls)})  # latency alone
        t = timing.comm_time_s(profile, hand_calibration(fits=fits), {"name": "allreduce", "ranks_per_node": 2})
        assert t["all_reduce"] == pytest.approx(calls * 2 * alpha)  # 2(N-1) = 2 alphas a call


# ---- the measurement -------------------------------------------------------------------------

def _pass(scale: float, speed: list[float]) -> dict:
    """One pass of the ranks' measurements as ``rank_main`` returns it, every time x ``scale``."""
    sizes = calibrate.sizes(4096, 4 * 2**20)
    return {"points": {kind: [(n, scale * alpha_beta.call_time_s(kind, 2, n, 1e-4, 1e9)) for n in sizes]
                       for kind in alpha_beta.MEASURED},
            "in_step": {kind: [[1e-3, scale * 5e-4], [5e-3, scale * 1e-3]] for kind in alpha_beta.MEASURED},
            "burst": {8: scale * 8e-4, 256: scale * 4e-4}, "speed": [(0.0, r) for r in speed], "hosts": ["vm"], "backend": "gloo",
            "threads": 1, "world_size": 2}


@pytest.mark.parametrize("swings", [False, True])
def test_where_the_machine_swings_while_timing_the_collectives_are_timed_again_and_the_median_kept(monkeypatch, swings):
    """A pass whose speed samples (one thread's matmul at the ranks' start and end) differ by 25 %
    or more is followed by another, up to 3; each size's, slice's and burst's time is the median
    over the passes, so that one slow spell (here a pass at twice the time) does not set them. A
    steady machine pays one pass."""
    passes = iter([_pass(2.0, [60e9, 121e9]), _pass(1.0, [110e9, 118e9]), _pass(1.05, [112e9, 115e9])] if swings
                  else [_pass(1.0, [110e9, 118e9])])
    monkeypatch.setattr(calibrate, "run_local", lambda w, sizes: next(passes))
    monkeypatch.setattr(calibrate, "compute_rates", lambda: {"cores": 2, "peak_flops_per_s_by_threads": {"1": 1e11}})
    monkeypatch.setattr(calibrate, "speed_sample", lambda: 115e9)
    c = calibrate.calibrate(2, 4 * 2**20)
    assert c["collective_passes"] == {"2": 3 if swings else 1}
    assert next(passes, None) is None  # every pass offered was used: 3 where it swung, 1 where steady
    f = c["collectives"]["all_reduce"]
    assert f["alpha_s"] == pytest.approx(1.05e-4 if swings else 1e-4, rel=1e-6)  # the median pass's, not the slow one's
    assert f["beta_bytes_per_s"] == pytest.approx(1e9 / 1.05 if swings else 1e9, rel=1e-6)
    assert f["burst_alpha"] == pytest.approx((8.4e-4 if swings else 8e-4) / 2)
    assert f["burst_alpha_by_calls"][1] == [256, pytest.approx((4.2e-4 if swings else 4e-4) / 2)]
    assert f["step_alpha"][0][1] == pytest.approx((5.25e-4 if swings else 5e-4) / 2)
    assert len(c["compute"]["speed_samples"]) == (7 if swings else 3)


@pytest.mark.slow
def test_calibrate_at_world_2_on_gloo_fits_positive_alpha_beta_that_reproduce_the_times(machine_calibration, monkeypatch):
    """The command end to end, small messages (4 KiB .. 256 KiB): every kind's fit is positive and
    reproduces its measured times within a factor 2 (median relative error <= 100 %). A size's time
    is the lower quartile of its calls: on 2 cores a call waits for its peer to be scheduled (3-4 ms)
    in up to half of them, and with the median a 256 KiB send once measured 1.4 ms against 0.06 ms
    at 64 KiB (median error 137 %). Five quiet calibrations with the quartile gave 1-15 %, but in
    the full test run a 256 KiB send still measured 0.90 ms against 0.06 ms at 64 KiB (0.14 ms in
    a quiet calibration that day), and the line, which must not make the largest message faster
    than measured, missed the middle sizes by 96 %: a bound of 50 % failed there, so the bound
    stays the factor 2 it was before.
    The fit's arithmetic is checked exactly on times the formula made (tests above).
    In its own interpreter: the command runs matmuls, and a process forked after that (the
    training ranks of a later test) can hang on the thread pool it inherits."""
    home, proc = machine_calibration  # tests/conftest.py: the command, run once a session
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    c = json.loads((home / "c.json").read_text())
    assert c["world_size"] == 2 and c["backend"] == "gloo"
    assert set(c["collectives"]) == set(alpha_beta.MEASURED)
    for kind, f in c["collectives"].items():
        assert len(f["points"]) == 4 and all(t > 0 for _, t in f["points"])
        assert f["alpha_s"] > 0 and f["beta_bytes_per_s"] > 0, (kind, f)
        predicted = [alpha_beta.call_time_s(kind, 2, n, f["alpha_s"], f["beta_bytes_per_s"]) for n, _ in f["points"]]
        errors = sorted(abs(p - t) / t for p, (_, t) in zip(predicted, f["points"]))
        assert errors[len(errors) // 2] <= 1.0, (kind, f["points"], predicted)
    assert c["compute"]["peak_flops_per_s_by_threads"]["1"] > 0
    assert c["compute"]["copy_bytes_per_s"] > 0 and "memory copy: 1 thread" in proc.stdout
    assert calibration.load(backend="gloo")["key"] == c["key"]  # found again in the cache by host
    assert c["load_average_at_start"] >= 0  # read before its own ranks start: busy_warning judges it
    # a small call of each kind timed between slices of compute of two lengths, as a step calls it
    for kind, f in c["collectives"].items():
        assert [s for s, _ in f["step_alpha"]] == sorted(s for s, _ in f["step_alpha"]) and len(f["step_alpha"]) == 2
        assert all(s > 0 and a >= 0 for s, a in f["step_alpha"]), (kind, f["step_alpha"])
    # and a burst of small all-reduces after compute, which the collectives share
    bursts = {k: f.get("burst_alpha") for k, f in c["collectives"].items()}
    assert bursts["all_reduce"] > 0 and bursts["all_gather"] == bursts["reduce_scatter"] == bursts["all_reduce"] * 2
    assert bursts["send"] is None and bursts["broadcast"] is None
    # and, where each of the 2 ranks has a core, a long burst too
    lengths = c["collectives"]["all_reduce"].get("burst_alpha_by_calls")
    if len(os.sched_getaffinity(0)) >= 2:
        assert [n for n, _ in lengths] == [8, 256] and all(a > 0 for _, a in lengths)
    else:
        assert lengths is None
    assert "in a step" in proc.stdout and "in a burst" in proc.stdout
    # the machine's speed sampled at the ranks' start and end and at the calibration's own end
    samples = c["compute"]["speed_samples"]
    assert len(samples) == 3 and all(r > 1e8 for _, r in samples), samples
    assert [at for at, _ in samples] == sorted(at for at, _ in samples) and samples[0][0] == 0
    table = proc.stdout
    assert "all_reduce" in table and "2(N-1)·α + 2(N-1)/N · n/β" in table


@pytest.mark.slow
def test_calibrate_with_a_recipe_times_each_world_and_the_model_with_as_many_ranks_at_once(tmp_path, monkeypatch):
    """--world-size 2,4: collectives fitted at each world (4 ranks on this machine's 2 cores wait
    for each other's turn), and the recipe's model stepped by 1, 2 and 4 ranks at once; a run at
    world 4 is then predicted from what was measured at 4."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "c.json"
    proc = subprocess.run([sys.executable, "-m", "suite.calibrate", "recipes/quickstart.yaml", "--world-size", "2,4",
                           "--max-bytes", str(64 * 2**10), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    c = json.loads(out.read_text())
    assert set(c["collectives_by_world"]) == {"2", "4"} and c["collectives"] == c["collectives_by_world"]["2"]
    # at 4 ranks, also groups of 2 with both groups calling at once (a hybrid's groups); none at 2
    grouped = c["collectives_in_groups"]
    assert set(grouped) == {"4"} and set(grouped["4"]) == {"2"}
    assert set(grouped["4"]["2"]) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert all(f["alpha_s"] > 0 and f["beta_bytes_per_s"] > 0 for f in grouped["4"]["2"].values())
    assert "at 4 ranks in groups of 2, all at once:" in proc.stdout
    (model,) = c["compute"]["models"].values()
    rates = model["by_ranks_per_node"]
    assert set(rates) == {"1", "2", "4"}
    assert [rates[k]["rank_batch"] for k in ("1", "2", "4")] == [64, 32, 16]  # quickstart's global batch 64
    assert all(r["flops_per_s"] > 0 and r["threads"] == max(1, c["compute"]["cores"] // r["ranks_per_node"])
               for r in rates.values())
    assert "4 rank(s) at once" in proc.stdout and "at 4 ranks:" in proc.stdout
    from suite import recipe as recipes

    recipe = recipes.load("recipes/quickstart.yaml", ["launch.tasks_per_node=4"])[0]
    rate, how = timing.compute_rate(c, 4, timing.model_key(recipe))
    assert rate == rates["4"]["flops_per_s"] and "4 rank(s) stepping at once" in how
    profile = step_profile("ddp", 4, comm={"all_reduce": (10**6, 1)})
    fit = c["collectives_by_world"]["4"]["all_reduce"]
    # the bandwidth at this message's size (beta_at: a timed message of that size where it spent
    # most of its time moving bytes, else the fit's): which one depends on this machine's timings
    assert timing.comm_time_s(profile, c)["all_reduce"] == pytest.approx(
        alpha_beta.call_time_s("all_reduce", 4, 10**6, fit["alpha_s"], alpha_beta.beta_at(fit, "all_reduce", 10**6)))


def test_calibrate_refuses_one_rank_in_one_line(capsys):
    assert calibrate_command.main(["--world-size", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --world-size 1") and "\n" not in err


# ---- the loop: recorded by the run, shown beside what the run measured ----------------------------

@pytest.mark.slow
def test_a_run_records_its_prediction_and_the_report_sets_it_beside_the_measurement(tmp_path):
    from analysis import report
    from suite.planner.predict import prediction
    from suite.record import run_record
    from suite.train import rank as train_rank
    from tests.parity import make_recipe, step_losses

    recipe = make_recipe({"name": "single"}, 1)
    run_dir = train_rank.new_run_dir(recipe, tmp_path / "runs")
    predicted = prediction(recipe, hand_calibration())
    assert predicted["source"] in ("fake", "analytic") and predicted["step_time_s"] > 0, predicted
    run_record.record_predicted(run_dir, predicted)
    step_losses(recipe, run_dir)
    summary = run_record.read_summary(run_dir)
    assert summary["predicted"] == predicted
    held = sum(predicted["held_bytes"].values())
    assert predicted["peak_bytes"] > held  # activations and the optimizer's temporaries on top
    assert 0 < summary["ranks"][0]["peak_memory_above_start_bytes"] < summary["ranks"][0]["peak_memory_bytes"]
    assert held < summary["ranks"][0]["peak_allocated_bytes"] < summary["ranks"][0]["peak_memory_bytes"]
    assert report.main([str(run_dir), "--out", str(tmp_path / "report"), "--no-wandb"]) == 0
    md = (tmp_path / "report" / "tables.md").read_text()
    assert "## Predicted vs measured" in md and "step time (s) error" in md and "held bytes predicted" in md
    (row,) = csv.DictReader((tmp_path / "report" / "predicted.csv").open())
    held = sum(summary["ranks"][0]["held_bytes"].values())
    assert int(row["held_measured"]) == held
    assert float(row["held_error"]) == pytest.approx(sum(predicted["held_bytes"].values()) / held - 1)
    assert float(row["step_error"]) == pytest.approx(predicted["step_time_s"] / summary["step_time_s"] - 1)
    assert float(row["rate_measured"]) == pytest.approx(summary["samples_per_s"])


def test_prediction_failure_is_recorded_not_raised():
    from suite.planner.predict import prediction

    assert "error" in prediction(object())


# Calibrating through Slurm on two nodes (launch.executor=slurm, one task on each) is tested where
# the link study runs that command: tests/submit/test_link_study.py.


@pytest.mark.slow
def test_a_calibration_slurm_refuses_is_one_line_and_exit_2(tmp_path):
    """sbatch failing ends the calibration with the scheduler's words in one line, not submitit's
    traceback. Here: a partition the cluster lacks, which sbatch refuses at once (a missing
    slurm.conf or a controller down takes the same path, after sbatch's own 60 s of retries)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "suite.calibrate", "recipes/quickstart.yaml", "launch.executor=slurm",
                           "launch.partition=no_such_partition", "--max-bytes", "8192"], capture_output=True, text=True,
                          env=env, timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error: sbatch refused the calibration job" in proc.stderr and "sinfo" in proc.stderr


def test_a_run_on_a_slurm_node_finds_the_calibration_taken_on_that_node_by_slurms_name(tmp_path, monkeypatch):
    """The nodes of the local (emulated) cluster share one host name: a calibration through Slurm is
    kept under Slurm's node names, and a rank there finds it, not the host's loopback one."""
    import socket

    from suite.planner import calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = calibration.cache_dir()
    folder.mkdir(parents=True)
    host = socket.gethostname()
    for name, hosts in ((f"{host}-gloo-1threads", [host]), ("n1+n2-gloo-2threads", ["n1", "n2"]),
                        ("n10-gloo-1threads", ["n10"])):
        (folder / f"{name}.json").write_text(json.dumps({"key": name, "backend": "gloo", "hosts": hosts}))
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert calibration.load()["key"] == f"{host}-gloo-1threads"
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert calibration.load()["key"] == "n1+n2-gloo-2threads"  # not n10's
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    assert calibration.load() is None


def test_a_calibration_begun_on_a_busy_machine_says_so():
    """Other work slows what a calibration times, and every prediction made from it: one begun at
    a load of half a process per core or more is flagged in one line; one from before the field
    (or of Slurm nodes, whose load this host cannot see) is not."""
    busy = {"load_average_at_start": 1.36, "compute": {"cores": 2}}
    warning = calibrate.busy_warning(busy)
    assert warning.count("\n") == 0 and "load average 1.36" in warning and "Calibrate again" in warning
    assert calibrate.busy_warning({"load_average_at_start": 0.22, "compute": {"cores": 2}}) is None
    assert calibrate.busy_warning({"compute": {"cores": 2}}) is None
    assert calibrate.busy_warning({"load_average_at_start": 1.36, "compute": {"cores": 8}}) is None
