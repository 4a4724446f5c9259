"""Third-party internals go through suite/compat/: each accessor works on the installed (pinned)
versions, and a missing internal fails loudly, naming the library, its installed version and what
was expected, instead of a silent default (0 bytes). The ZeRO-1/2/3 byte counts themselves stay
covered by tests/strategies/test_zero.py; the pipeline accessors by tests/strategies/test_pipeline.py and
tests/strategies/test_ds_pipeline.py; the CIFAR override by tests/data/test_data.py."""
import inspect
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from suite.compat import CHECKED, CompatError, deepspeed as ds_compat, import_internal, installed_version, require_attr
from suite.compat import submitit as submitit_compat, torch as torch_compat, torchvision as tv_compat
from suite.planner.memory import parameter_count
from suite.strategies import _deepspeed
from tests.parity import BASE, make_recipe, step_losses
from tests.strategies.test_zero import held, near

_deepspeed.preload()  # once here, not once per forked rank

REPO = Path(__file__).resolve().parents[2]
ADAM = {"name": "adam", "lr": 0.01}
WORLD = 2


def loud(lib: str, *expected: str):
    """pytest.raises for the compat error: names the library, its installed and checked versions."""
    parts = [f"{lib} {installed_version(lib)}", f"{lib} {CHECKED[lib]}", *expected]
    return pytest.raises(CompatError, match=".*".join(re.escape(p) for p in parts))


def engine(optimizer, stage: int):
    """Stand-in for a DeepSpeed engine: what the compat accessors read of one."""
    return SimpleNamespace(optimizer=optimizer, zero_optimization_stage=lambda: stage)


def bare(module: str, name: str):
    """An instance of a DeepSpeed optimizer wrapper class with none of its attributes set."""
    cls = import_internal(module, name, lib="deepspeed")
    return object.__new__(cls)


# ---- versions -------------------------------------------------------------------------------

def _constraints() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line.strip() and not line.startswith("#"))


def test_the_tested_versions_are_the_installed_ones_the_constraints_and_within_the_ranges():
    from packaging.requirements import Requirement

    from suite.compat import TESTED

    pinned = _constraints()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    ranges = {Requirement(r).name: Requirement(r).specifier for r in extras + project["dependencies"]}
    docs = (REPO / "docs/compat.md").read_text()
    for lib, version in TESTED.items():
        assert installed_version(lib).split("+")[0] == version, lib
        assert pinned[lib] == version, lib
        assert version in ranges[lib] and not str(ranges[lib]).startswith("=="), (lib, ranges[lib])
    for lib, version in CHECKED.items():
        assert f"{lib} {version}" in docs, lib


def test_a_library_outside_the_tested_set_is_one_line_naming_it_and_what_is_untested(monkeypatch):
    import suite.compat as compat

    assert compat.untested_line() == ""  # this machine runs the tested set
    monkeypatch.setattr(compat, "installed_version", lambda lib: "2.9.0+cu121" if lib == "torch" else compat.TESTED[lib])
    line = compat.untested_line()
    assert "\n" not in line and line.startswith("note: outside the tested set")
    assert "torch 2.9.0+cu121 (tested 2.14.1; untested: suite/compat/torch.py's internal reads" in line
    assert "deepspeed" not in line


def test_the_submitting_side_says_it_at_start_up_without_importing_torch(monkeypatch, capsys):
    import subprocess
    import sys

    import suite.compat as compat
    from suite.submit import cli

    code = "import sys, suite.compat; suite.compat.untested_line(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    monkeypatch.setattr(compat, "installed_version", lambda lib: "0.20.0" if lib == "deepspeed" else compat.TESTED[lib])
    cli.main([str(REPO / "recipes/quickstart.yaml"), "--dry-run"])
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "outside the tested set" in line] == [err[0]] and "deepspeed 0.20.0" in err[0]


def test_every_accessor_is_documented():
    docs = (REPO / "docs/compat.md").read_text()
    for module in (ds_compat, torch_compat, tv_compat, submitit_compat):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and not name.startswith("_"):
                assert f"`{name}`" in docs, f"{module.__name__}.{name} is not in docs/compat.md"


# ---- a missing internal is a loud error ---------------------------------------------------------

def test_a_missing_attribute_names_the_library_its_version_and_what_was_expected():
    stand_in = SimpleNamespace()
    with loud("deepspeed", "SimpleNamespace.single_partition_of_fp32_groups"):
        require_attr(stand_in, "single_partition_of_fp32_groups", lib="deepspeed")
    err = pytest.raises(CompatError, require_attr, stand_in, "x", lib="torch").value
    assert "\n" not in str(err) and "constraints.txt" in str(err) and "docs/compat.md" in str(err)


@pytest.mark.parametrize("accessor, module, name, stage, missing", [
    ("master_weights", "deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", 2,
     "single_partition_of_fp32_groups"),
    ("master_weights", "deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", 3,
     "fp32_partitioned_groups_flat"),
    ("master_weights", "deepspeed.runtime.bf16_optimizer", "BF16_Optimizer", 1, "fp32_groups_flat_partition"),
    ("master_weights", "deepspeed.runtime.fp16.unfused_optimizer", "FP16_UnfusedOptimizer", 0, "fp32_groups"),
    ("gradient_buffers", "deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", 1, "averaged_gradients"),
    ("gradient_buffers", "deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", 3, "averaged_gradients"),
    ("gradient_buffers", "deepspeed.runtime.bf16_optimizer", "BF16_Optimizer", 0, "fp32_groups_gradients_flat"),
])
def test_a_renamed_buffer_fails_instead_of_counting_0_bytes(accessor, module, name, stage, missing):
    with loud("deepspeed", f"{name}.{missing}"):
        getattr(ds_compat, accessor)(engine(bare(module, name), stage))


def test_the_wrapper_is_checked_against_the_zero_stage():
    zero3 = bare("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3")
    with loud("deepspeed", "DeepSpeedZeroOptimizer_Stage3 only at ZeRO stage(s) [3]", "stage 1"):
        ds_compat.master_weights(engine(zero3, 1))
    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    with loud("deepspeed", "a ZeRO optimizer wrapper at stage 2"):
        ds_compat.inner_optimizer(engine(adam, 2))
    with loud("deepspeed", "not builtins.object"):
        ds_compat.master_weights(engine(object(), 1))


def test_a_plain_optimizer_at_stage_0_holds_no_master_copy():
    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    stage0 = engine(adam, 0)
    assert ds_compat.inner_optimizer(stage0) is adam
    assert ds_compat.master_weights(stage0) == [] and ds_compat.gradient_buffers(stage0) == []


def test_zero3_parameters_are_their_partitions_and_only_at_stage_3():
    plain = torch.nn.Parameter(torch.zeros(4))
    assert ds_compat.parameter_partitions(engine(None, 2), [plain]) == [plain]
    with loud("deepspeed", "Parameter.ds_tensor"):
        ds_compat.parameter_partitions(engine(None, 3), [plain])
    plain.ds_tensor = torch.zeros(2)
    assert ds_compat.parameter_partitions(engine(None, 3), [plain])[0] is plain.ds_tensor


def test_pipeline_engine_internals_fail_loudly():
    with loud("deepspeed", "SimpleNamespace.dp_group_loss"):
        ds_compat.replica_loss(SimpleNamespace())
    with loud("deepspeed", "SimpleNamespace.reset_activation_shape"):
        ds_compat.reset_activation_shapes(SimpleNamespace())
    with loud("deepspeed", "SimpleNamespace.stage_owner"):
        ds_compat.owns_layer(SimpleNamespace(stage_id=0), 0)
    pipe = SimpleNamespace(stage_id=1, stage_owner=lambda i: 0 if i < 2 else 1)
    assert [ds_compat.owns_layer(pipe, i) for i in range(4)] == [False, False, True, True]


def test_deepspeed_start_up_patches(monkeypatch):
    import importlib

    comm_torch = importlib.import_module("deepspeed.comm.torch")
    op_builder = import_internal("deepspeed.ops.op_builder.builder", "OpBuilder", lib="deepspeed")
    monkeypatch.setattr(comm_torch, "build_shm_op", comm_torch.build_shm_op)  # restored after the test
    monkeypatch.setattr(op_builder, "jit_load", op_builder.jit_load)
    ds_compat.skip_shm_op_build()
    assert comm_torch.build_shm_op() is None
    ds_compat.announce_op_builds()
    assert op_builder.jit_load.announces
    monkeypatch.delattr(comm_torch, "build_shm_op")
    with loud("deepspeed", "deepspeed.comm.torch.build_shm_op"):
        ds_compat.skip_shm_op_build()
    monkeypatch.delattr(op_builder, "jit_load")
    with loud("deepspeed", "OpBuilder.jit_load"):
        ds_compat.announce_op_builds()


def test_internal_modules_resolve_and_a_missing_one_fails_loudly():
    ds_compat.preload_modules()
    assert ds_compat.config_class().__name__ == "DeepSpeedConfig"
    with loud("torch", "module torch.distributed._composable.no_such_module"):
        import_internal("torch.distributed._composable.no_such_module", lib="torch")
    assert callable(import_internal("torch.distributed._composable.replicate_with_fsdp", "replicate", lib="torch"))


def test_the_timed_pipeline_stage_needs_the_schedules_compute_methods(monkeypatch):
    from torch.distributed.pipelining import PipelineStage

    timed = torch_compat.timed_stage_class(lambda: None)
    assert issubclass(timed, PipelineStage)
    assert all(name in vars(timed) for name in torch_compat.STAGE_COMPUTE_METHODS)
    owner = next(c for c in PipelineStage.__mro__ if "backward_weight_one_chunk" in vars(c))
    monkeypatch.delattr(owner, "backward_weight_one_chunk")
    with loud("torch", "PipelineStage.backward_weight_one_chunk"):
        torch_compat.timed_stage_class(lambda: None)


def test_a_step_without_timed_compute_is_an_error_not_a_bubble_of_1():
    assert torch_compat.busy_s(SimpleNamespace(busy_s=0.25)) == 0.25
    with loud("torch", "forward_one_chunk"):
        torch_compat.busy_s(SimpleNamespace(busy_s=0.0))


def test_the_cifar_override_needs_torchvisions_hooks(monkeypatch):
    import torchvision.datasets as tvd

    assert issubclass(tv_compat.cifar_without_md5(tvd.CIFAR100), tvd.CIFAR100)
    monkeypatch.delattr(tvd.CIFAR10, "_load_meta")
    with loud("torchvision", "CIFAR10._load_meta"):
        tv_compat.cifar_without_md5(tvd.CIFAR10)


# ---- bytes held where a getattr default used to hide them -------------------------------------

@pytest.mark.slow
def test_offloaded_zero2_gradients_are_counted(tmp_path):
    """Under optimizer offload ZeRO-2 keeps the gradient partition on the fp32 master copy's .grad
    (not in averaged_gradients): half the gradients per rank, not 0."""
    recipe = make_recipe({"name": "zero", "stage": 2, "offload_optimizer": True}, world_size=WORLD, optimizer=ADAM)
    step_losses(recipe, tmp_path)
    p = 4 * parameter_count(recipe)
    for rank in held(tmp_path):
        assert near(rank["gradients"], p / WORLD), rank
        assert near(rank["optimizer_state"], (2 * p + p) / WORLD), rank  # Adam + fp32 master partition


@pytest.mark.slow
def test_bf16_without_zero_counts_its_fp32_master_copy(tmp_path):
    """bf16 at stage 0: the module is bf16 and DeepSpeed keeps a full fp32 master copy
    (FP16_UnfusedOptimizer.fp32_groups), counted as optimizer state."""
    recipe = make_recipe({"name": "zero", "stage": 0}, world_size=WORLD, optimizer=ADAM,
                         training={**BASE["training"], "precision": "bf16"})
    step_losses(recipe, tmp_path)
    p = 4 * parameter_count(recipe)
    for rank in held(tmp_path):
        assert near(rank["parameters"], p / 2) and near(rank["gradients"], p / 2), rank  # bf16
        assert near(rank["optimizer_state"], 2 * p + p), rank  # Adam on the fp32 copy + the copy


# ---- submitit ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_submitit_accessors_work_on_a_real_local_job(tmp_path):
    import submitit

    executor = submitit.LocalExecutor(tmp_path)
    executor.update_parameters(timeout_min=1)
    job = executor.submit(sorted, [2, 1])
    assert job.result() == [1, 2]
    assert submitit_compat.left_result(job.task(0)) and submitit_compat.task_error(job.task(0)) is None
    failed = executor.submit(int, "not a number")
    failed.wait()
    assert "ValueError" in submitit_compat.task_error(failed.task(0))
    paths = submitit_compat.task_paths(tmp_path, job.job_id, 0)
    assert paths.stdout == job.task(0).paths.stdout
    assert issubclass(submitit_compat.failed_job_error(), Exception)


def test_a_task_without_its_result_file_reads_as_killed_and_changed_paths_fail_loudly():
    task = SimpleNamespace(paths=SimpleNamespace(result_pickle=Path("/nonexistent/result.pkl")))
    assert not submitit_compat.left_result(task)
    with loud("submitit", "result_pickle"):
        submitit_compat.left_result(SimpleNamespace(paths=SimpleNamespace()))


def test_only_submitits_own_requeue_handler_is_kept(monkeypatch):
    import signal

    previous = signal.getsignal(signal.SIGUSR2)
    try:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        assert submitit_compat.requeue_handler() is None  # torchrun, a plain process
        signal.signal(signal.SIGUSR2, lambda *_: None)
        assert submitit_compat.requeue_handler() is None  # someone else's handler
        from submitit.core.job_environment import SignalHandler

        handler = SignalHandler.__new__(SignalHandler).checkpoint_and_try_requeue
        signal.signal(signal.SIGUSR2, handler)
        assert submitit_compat.requeue_handler() == handler
    finally:
        signal.signal(signal.SIGUSR2, previous)


@pytest.mark.slow
def test_a_failed_tasks_error_is_read_at_once_while_its_peers_still_run(tmp_path):
    """A warm pool's rank 0 goes on serving after another task failed: the follower must read the
    failed task's error without waiting for the job (submitit's exception() would wait)."""
    import time

    import submitit

    from suite.submit.task_ends import submitit_error as _submitit_error
    from tests.submitit_tasks import rank1_fails_while_rank0_works

    executor = submitit.LocalExecutor(tmp_path)
    executor.update_parameters(timeout_min=2, tasks_per_node=2)
    job = executor.submit(rank1_fails_while_rank0_works, 60)
    try:
        deadline = time.time() + 60
        while not submitit_compat.left_result(job.task(1)) and time.time() < deadline:
            time.sleep(0.1)
        started = time.time()
        rank, line, _ = _submitit_error(job)
        assert (rank, line) == (1, "ValueError: planted failure on rank 1") and time.time() - started < 2
        assert job.state == "RUNNING"
    finally:
        job.cancel(check=False)
        # Its controller prints the interrupt as it ends: inside the test, not after pytest has exited.
        deadline = time.time() + 10
        while not job.done() and time.time() < deadline:
            time.sleep(0.1)
