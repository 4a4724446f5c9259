"""Checks before launch (suite.submit.preflight): data files, batch against the data set, device,
memory against the node, cores, Slurm settings. Each refusal is one line naming the key or file, exit 2."""
import os
import pickle
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from suite.submit import cli as submit
from tests.data.test_data import write_idx
from tests.recipe.test_recipe_errors import QUICKSTART, assert_one_line

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal does not apply")
slurm = pytest.mark.skipif(shutil.which("sinfo") is None,
                           reason="no Slurm here (sinfo not found); .ci/run starts a local cluster with slurm/start.sh")


def dry_run(capsys, *args):
    code = submit.main([QUICKSTART, *args, "--dry-run"])
    captured = capsys.readouterr()
    return code, captured.err.strip()


# ---- data files -----------------------------------------------------------------------------

def mnist(root, n_train=12, n_val=5):
    raw = root / "MNIST" / "raw"
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("t10k", n_val)):
        write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{split}-labels-idx1-ubyte", np.arange(n) % 10)
    return raw


def cifar10(root):
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(base / name, "wb") as f:
            pickle.dump({"data": np.zeros((4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 3]}, f)
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return base


@pytest.mark.slow
@pytest.mark.parametrize("damage, named", [
    (lambda raw: (raw / "train-images-idx3-ubyte").write_bytes(os.urandom(4000)), "magic number"),
    (lambda raw: (raw / "train-images-idx3-ubyte").write_bytes((raw / "train-images-idx3-ubyte").read_bytes()[:-100]),
     "truncated or padded"),
    (lambda raw: (raw / "t10k-labels-idx1-ubyte").unlink(), "t10k-labels-idx1-ubyte is missing"),
    (lambda raw: write_idx(raw / "train-labels-idx1-ubyte", np.arange(3)), "holds 3 labels but"),
])
def test_a_damaged_mnist_file_is_named_before_launch(capsys, tmp_path, damage, named):
    damage(mnist(tmp_path))
    code, err = dry_run(capsys, "data.name=mnist", f"data.root={tmp_path}", "training.batch_size=4")
    assert_one_line(code, err, "data file", named)


@pytest.mark.slow
@pytest.mark.parametrize("damage, named", [
    (lambda base: (base / "data_batch_3").write_bytes(b"not a pickle at all"), "data_batch_3 is not a pickled CIFAR file"),
    (lambda base: (base / "test_batch").unlink(), "test_batch is missing"),
    (lambda base: (base / "data_batch_1").write_bytes(pickle.dumps({"data": np.zeros((4, 3072))})),
     "data_batch_1 is not a CIFAR dict with data, labels"),
    (lambda base: (base / "data_batch_2").write_bytes(pickle.dumps({"data": np.zeros((4, 10)), "labels": [0] * 4})),
     "expected N x 3072"),
])
def test_a_damaged_cifar_file_is_named_before_launch(capsys, tmp_path, damage, named):
    damage(cifar10(tmp_path))
    code, err = dry_run(capsys, "data.name=cifar10", f"data.root={tmp_path}", "training.batch_size=4")
    assert_one_line(code, err, named)


@pytest.mark.slow
def test_standard_files_pass(capsys, tmp_path):
    mnist(tmp_path)
    code, err = dry_run(capsys, "data.name=mnist", f"data.root={tmp_path}", "training.batch_size=4")
    assert code == 0, err


# ---- recipe against data, device and node ---------------------------------------------------

@pytest.mark.slow
def test_a_batch_larger_than_the_data_set_per_rank(capsys):
    assert_one_line(*dry_run(capsys, "training.batch_size=4000"), "training.batch_size=4000",
                    "1438 samples", "use training.batch_size <= 1438")


@pytest.mark.slow
def test_a_batch_larger_than_a_limited_data_set(capsys):
    assert_one_line(*dry_run(capsys, "data.limit_train=50"), "training.batch_size=64", "50 samples")


@pytest.mark.slow
def test_1f1b_needs_as_many_micro_batches_as_stages(capsys):
    code, err = dry_run(capsys, "strategy.name=pipeline", "strategy.schedule=1f1b", "strategy.micro_batches=1")
    assert_one_line(code, err, "strategy.schedule=1f1b", "strategy.micro_batches", "stages (2)")


@pytest.mark.slow
@no_gpu
def test_cuda_without_a_gpu(capsys):
    assert_one_line(*dry_run(capsys, "launch.device=cuda"), "launch.device=cuda", "no GPU")


@pytest.mark.slow
@no_gpu
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_deepspeed_fp16_is_refused_wherever_the_ranks_run_on_cpu(capsys, device):
    assert_one_line(*dry_run(capsys, "training.precision=fp16", f"launch.device={device}", "strategy.name=zero",
                             "strategy.stage=2"),
                    "training.precision=fp16 with strategy zero needs a GPU", "bf16")


@no_gpu
def test_torch_fp16_runs_on_cpu_with_loss_scaling(capsys):
    # torch's CPU autocast and GradScaler run fp16 (suite.strategies.scaling): no refusal
    code, err = dry_run(capsys, "training.precision=fp16", "launch.device=cpu")
    assert code == 0, err


@pytest.mark.slow
def test_a_model_beyond_the_node_s_memory_is_refused_unless_forced(capsys):
    assert_one_line(*dry_run(capsys, "model.hidden=[100000,100000]"), "model", "GiB per rank", "--force")
    assert dry_run(capsys, "model.hidden=[100000,100000]", "--force")[0] == 0


@pytest.mark.slow
def test_more_threads_than_cores_is_a_one_line_warning(capsys):
    cores = len(os.sched_getaffinity(0))
    code, err = dry_run(capsys, f"launch.tasks_per_node={cores + 1}", f"training.batch_size={64 * (cores + 1)}")
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and f"launch.tasks_per_node={cores + 1}" in warnings[0] and "oversubscribed" in warnings[0]
    code, err = dry_run(capsys, f"launch.cpus_per_task={cores + 1}")
    assert code == 0 and "launch.cpus_per_task" in err


def test_the_rank_marks_a_node_with_more_threads_than_cores(monkeypatch):
    from suite.train.tracking import oversubscribed

    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "2")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert not oversubscribed(SimpleNamespace(local_world_size=2))
    assert oversubscribed(SimpleNamespace(local_world_size=3))


def test_the_report_marks_oversubscribed_rows():
    from analysis import tables
    from suite.record.run_record import Summary

    summary = Summary(status="completed", model="mlp", global_batch=64, samples_per_s=10.0, epoch_time_s=[1.0],
                      ranks=[], oversubscribed=True).model_dump()
    run = SimpleNamespace(experiment="e", arm=None, strategy="ddp", world_size=4, summary=summary)
    (row,) = tables.throughput_rows(tables.configs([run]))
    assert row["oversubscribed"] is True


# ---- failed submission ----------------------------------------------------------------------

@pytest.mark.slow
def test_a_refused_sbatch_leaves_a_failed_summary_not_a_bare_folder(tmp_path, monkeypatch):
    import submitit

    from suite import recipe as recipes
    from suite.common.errors import SuiteError
    from suite.record import run_record
    from suite.submit import launch

    class Refusing:
        def submit(self, task):
            raise submitit.core.utils.FailedJobError("sbatch: error: invalid partition specified: nope")

    monkeypatch.setattr(launch, "make_executor", lambda *a: Refusing())
    (r,) = recipes.load(QUICKSTART, ["launch.executor=slurm"])
    run_dir = run_record.new_run_dir(r.name, recipes.dump(r), tmp_path)
    with pytest.raises(SuiteError, match="sbatch refused the job .*invalid partition"):
        launch.submit([(r, run_dir)])
    summary = run_record.read_summary(run_dir)
    assert summary["status"] == "failed" and "invalid partition" in summary["error"]


# ---- Slurm settings the cluster lacks (the real local Slurm) ----------------------------------

@pytest.mark.slow
@slurm
@pytest.mark.parametrize("args, named", [
    (["launch.partition=nope"], ["launch.partition='nope'", "choose one of"]),
    (["launch.account=nope"], ["launch.account='nope'", "choose one of"]),
    (["launch.qos=nope"], ["launch.qos='nope'", "choose one of"]),
    (["launch.gpus_per_node=1"], ["launch.gpus_per_node=1", "no GPUs"]),
    (["launch.sbatch_extra={no_such_option: 1}"], ["launch.sbatch_extra.no_such_option", "--no-such-option"]),
    (["launch.cpus_per_task=64"], ["launch.cpus_per_task=64"]),
])
def test_slurm_settings_the_cluster_lacks_are_refused_before_submitting(capsys, args, named):
    assert_one_line(*dry_run(capsys, "launch.executor=slurm", *args), *named)


@pytest.mark.slow
@slurm
def test_slurm_settings_the_cluster_has_pass(capsys):
    code, err = dry_run(capsys, "launch.executor=slurm", "launch.partition=debug")
    assert code == 0, err


def test_the_torchrun_executor_is_recorded_by_torchrun_not_started_by_submit(capsys):
    assert_one_line(*dry_run(capsys, "launch.executor=torchrun"), "launch.executor=torchrun",
                    "torchrun --nnodes N --nproc-per-node G -m suite.train")
