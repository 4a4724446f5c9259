"""python -m suite.verify: a parity certificate for any recipe. It must say "equivalent" for a
correct strategy on a model it was not tuned to, and "differs" (exit 1) where the strategy
computes something else: batch norm per rank, or gradients summed instead of averaged."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from suite.verify import judge
from suite.verify.certificate import MARGIN, UNIT_ROUNDOFF

STEPS = 8
# A model with batch norm, so that per-rank statistics would show: 16 samples a step, 8 per rank.
RECIPE = {
    "name": "verify-bn",
    "model": {"name": "resnet18", "width": 0.125},
    "data": {"name": "synthetic", "shape": [3, 16, 16], "classes": 10, "n_train": 256, "n_val": 32},
    "strategy": {"name": "ddp"},
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
    "training": {"epochs": 1, "batch_size": 16, "seed": 3},
    "launch": {"tasks_per_node": 2},
    "tracking": {"wandb": "offline"},  # as users run it: tracking on
}


def _verify(tmp_path, *args, recipe=RECIPE, env=None):
    """suite.verify as a user runs it: W&B as the recipe says (offline), not the tests' WANDB_MODE."""
    import os

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {k: v for k, v in (env or os.environ).items() if k != "WANDB_MODE"}
    proc = subprocess.run([sys.executable, "-m", "suite.verify", str(path), "--steps", str(STEPS),
                           "--out", str(tmp_path / "runs"), *args], capture_output=True, text=True, timeout=600,
                          env=env)
    return proc


def _certificates(tmp_path):
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "runs").glob("*/verify.json"))]


# ---- the judgement -------------------------------------------------------------------------

@pytest.mark.parity
def test_a_difference_within_the_running_floor_passes_and_one_beyond_it_fails_from_its_step():
    single = [2.0, 1.9, 1.8, 1.7]
    floor = [2.0, 1.9 + 1e-14, 1.8 + 1e-13, 1.7]  # the nudged run parts by 1e-14, then 1e-13
    same = [2.0, 1.9 + 1e-13, 1.8, 1.7 + 1e-12]  # within 100x the largest floor so far
    checks = judge(single, same, floor, "fp64")
    assert all(c.ok for c in checks)
    assert checks[3].bound == pytest.approx(MARGIN * 1e-13 + 16 * UNIT_ROUNDOFF["fp64"] * 1.7, rel=1e-3)
    broken = [2.0, 1.9, 1.8 + 1e-4, 1.7]
    assert [c.ok for c in judge(single, broken, floor, "fp64")] == [True, True, False, True]


@pytest.mark.parity
def test_the_loss_may_differ_by_its_own_rounding_even_where_the_floor_is_zero():
    one_ulp = 2.0 * UNIT_ROUNDOFF["fp32"] * 2
    checks = judge([2.0, 2.0], [2.0 + one_ulp, 2.0 + 100 * one_ulp], [2.0, 2.0], "fp32")
    assert [c.ok for c in checks] == [True, False]


@pytest.mark.parity
def test_the_verdict_says_from_which_step_the_floor_is_too_large_to_tell():
    from suite.verify import Certificate

    single = [2.0, 2.0, 2.0]
    floor = [2.0, 2.0 + 1e-6, 2.0 + 1e-3]  # the nudged run parts by 1e-3 at step 3: bound 0.1 > 1% of 2.0
    cert = Certificate("ddp", 2, "fp64", "float64", judge(single, single, floor, "fp64"))
    assert cert.verdict == "equivalent" and cert.telling_through == 2
    assert "from step 3 the floor passes 1% of the loss" in cert.verdict_line()
    calm = Certificate("ddp", 2, "fp64", "float64", judge(single, single, single, "fp64"))
    assert calm.telling_through == 3 and "tell little" not in calm.verdict_line()


# ---- end to end ----------------------------------------------------------------------------

def with_dropout(spec, p: float = 0.2):
    """torchvision's MNASNet ends so: a dropout before the classifier."""
    import math

    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(spec.input_shape), 16), nn.Dropout(p),
                         nn.Linear(16, spec.num_classes))


def test_a_model_with_dropout_is_named_as_the_reason_it_differs():
    """Each rank draws its own dropout masks: the losses part from the first step whatever the
    strategy. The verdict says so, so that a user does not hunt a bug in the strategy; with the rate
    at 0, or at world size 1, nothing is said."""
    from suite.verify.certificate import Certificate, StepCheck
    from suite.verify.runs import dropout_of
    from tests.parity import make_recipe

    model = {"target": "tests.commands.test_verify:with_dropout"}
    data = {"name": "synthetic", "shape": [1, 8, 8], "classes": 4, "n_train": 64, "n_val": 16}
    assert dropout_of(make_recipe({"name": "ddp"}, 2, model=model, data=data)) == "1 dropout module"
    assert dropout_of(make_recipe({"name": "ddp"}, 2, model={**model, "p": 0.0}, data=data)) == ""
    differs = [StepCheck(1, 2.0, 2.5, 0.5, 1e-14, 1e-12, False)]
    line = Certificate("ddp", 2, "fp64", "", differs, dropout="1 dropout module").verdict_line()
    assert "differs from step 1" in line and "the model has 1 dropout module" in line and "dropout to 0" in line
    assert "dropout" not in Certificate("ddp", 2, "fp64", "", differs).verdict_line()


@pytest.mark.slow
def test_ddp_with_synced_batch_norm_is_equivalent_and_per_rank_batch_norm_differs(tmp_path):
    proc = _verify(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("ddp at world size 2 (fp64, 8 steps): equivalent"), last
    (cert,) = _certificates(tmp_path)
    assert cert["verdict"] == "equivalent" and cert["precision"] == "fp64" and len(cert["steps"]) == STEPS
    assert max(s["difference"] for s in cert["steps"]) < 1e-10  # float64: rounding only
    # the report shows the certificate, and compares the strategy's run, not the baselines kept in it
    report = subprocess.run([sys.executable, "-m", "analysis.report", str(tmp_path / "runs"), "--out",
                             str(tmp_path / "report"), "--no-wandb"], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert "(1 run(s), 0 skipped)" in report.stdout
    parity = (tmp_path / "report" / "parity.csv").read_text().splitlines()
    assert len(parity) == 2 and ",ddp,2,fp64,8,equivalent," in parity[1], parity

    per_rank = tmp_path / "per-rank"
    per_rank.mkdir()
    proc = _verify(per_rank, "training.sync_batchnorm=false")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "differs from step 1" in proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_strategy_broken_on_purpose_differs_and_one_that_fails_is_named_beside_it(tmp_path):
    """allreduce summing the ranks' gradients instead of averaging them, and fsdp raising in its
    third step, patched into every process of the run (sitecustomize runs at each interpreter's
    start). Both run as one sweep: the failed one is named, the other still judged."""
    patch = tmp_path / "patch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(textwrap.dedent("""
        import torch.distributed as dist
        from suite.strategies import allreduce, fsdp

        def summed(self):
            for p in self.module.parameters():
                dist.all_reduce(p.grad)

        allreduce.AllReduceEngine.reduce_gradients = summed
        step = fsdp.FSDPEngine.train_step

        def failing(self, *args, **kwargs):
            self.steps_taken = getattr(self, "steps_taken", 0) + 1
            if self.steps_taken == 3:
                raise RuntimeError("broken on purpose")
            return step(self, *args, **kwargs)

        fsdp.FSDPEngine.train_step = failing
    """))
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(patch), os.getcwd()])}
    recipe = {**RECIPE, "model": {"name": "mlp", "hidden": [32]}, "strategy": {"name": "allreduce"}}
    proc = _verify(tmp_path, "--strategies", "allreduce,fsdp", recipe=recipe, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "allreduce at world size 2 (fp64, 8 steps): differs from step 2" in proc.stdout
    assert "fsdp at world size 2: did not run (verify: the strategy fsdp run failed" in proc.stdout, proc.stdout
    assert "broken on purpose" in proc.stderr, proc.stderr
    (cert,) = _certificates(tmp_path)
    assert cert["strategy"] == "allreduce" and cert["first_bad_step"] == 2 and cert["steps"][1]["difference"] > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("strategy, message", [
    ("hogwild", "makes no parity claim"),
    ("single", "the baseline itself"),
])
def test_a_strategy_with_nothing_to_certify_is_one_line_and_exit_2(tmp_path, strategy, message):
    recipe = {**RECIPE, "model": {"name": "mlp", "hidden": [32]}, "strategy": {"name": strategy},
              "launch": {"tasks_per_node": 1 if strategy == "single" else 2}}
    proc = _verify(tmp_path, recipe=recipe)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ---- a model the suite never saw ------------------------------------------------------------

@pytest.mark.slow
def test_every_strategy_that_can_run_a_torchvision_model_named_by_target_is_equivalent(tmp_path):
    """torchvision's ShuffleNetV2 named directly by target: (Hydra's convention), no wrapper. In
    float32 its losses part from single's by 2e-2 within 30 steps under any strategy, and single
    on 1 thread from single on 2 by 5e-2: only the certificate can tell a bug from rounding.
    --strategies all: every strategy that claims parity and can run it; the others are named."""
    recipe = {**RECIPE, "name": "shufflenet",
              "model": {"target": "torchvision.models:shufflenet_v2_x0_5", "num_classes": 10},
              "data": {**RECIPE["data"], "shape": [3, 32, 32]}}
    proc = _verify(tmp_path, "--strategies", "all", recipe=recipe)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    certs = _certificates(tmp_path)
    names = sorted(c["strategy"] for c in certs)
    assert {"ddp", "allreduce", "fsdp", "fsdp1", "oss", "zero"} <= set(names), names
    assert all(c["verdict"] == "equivalent" for c in certs), [(c["strategy"], c["verdict_line"]) for c in certs]
    assert all(c["precision"] == ("fp32" if c["strategy"] == "zero" else "fp64") for c in certs)
    # the float64 strategies ran as one sweep (one submit, one pool of warm ranks), named by strategy,
    # against one single and one floor run
    fp64 = [c for c in certs if c["precision"] == "fp64"]
    pools = {(Path(c["runs"]["strategy"]) / "submitit").resolve() for c in fp64}
    assert len(pools) == 1, pools
    assert all(Path(c["runs"]["strategy"]).name.startswith(f"shufflenet-verify-{c['strategy']}-") for c in fp64)
    assert len({(c["runs"]["single"], c["runs"]["floor"]) for c in fp64}) == 1
    # ZeRO cannot train in float64: judged in float32 against the float32 floor, and says why
    (zero,) = [c for c in certs if c["strategy"] == "zero"]
    assert "float32 master copies" in zero["why_precision"], zero["why_precision"]
    # single and the floor of both precisions ran as one sweep (one submit, one pool of warm ranks)
    baselines = {Path(c["runs"][role]) for c in certs for role in ("single", "floor")}
    assert len(baselines) == 4 and len({(p / "submitit").resolve() for p in baselines}) == 1, baselines
    # the strategies that cannot run it say why, one line each: not an nn.Sequential to cut, no tensor layout
    assert "skipped pipeline:" in proc.stderr and "skipped tensor:" in proc.stderr, proc.stderr
