"""Checks before anything launches that need more than the recipe schema: the data files, the run
folder, the device the ranks will get, memory against the node, cores, and the Slurm settings.

A problem is a one-line ``SuiteError`` naming the recipe key (or file) and the fix; a setting that
will run but slowly (more threads than cores) is a one-line warning.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from suite.common import network
from suite.common.errors import SuiteError

_GIB = 2**30


def check(points, out: Path, force: bool = False, dry_run: bool = False) -> list[dict]:
    """Check every recipe of a submission; returns each one's predicted bytes (``suite.planner.memory``).
    ``force``: launch even when the predicted bytes exceed the node's memory."""
    if points[0].launch.executor == "torchrun":
        raise SuiteError("launch.executor=torchrun is what `torchrun -m suite.train` records, not one suite.submit "
                         "starts; run torchrun --nnodes N --nproc-per-node G -m suite.train RECIPE, or use "
                         "launch.executor=local or slurm")
    if not dry_run:
        check_out(Path(out))
    node = _Node.of(points[0].launch)
    slurm = points[0].launch.executor == "slurm"
    if slurm:  # Slurm gives each task its CPUs, so asking for too many is refused, not oversubscribed
        for launch in {r.launch.model_dump_json(): r.launch for r in points}.values():
            check_slurm(launch, node)
    if points[0].launch.executor == "mpi":
        from suite.submit import mpi

        mpi.mpirun_path()
    if slurm and points[0].launch.mpi:
        from suite.submit import mpi

        mpi.check_srun_pmix()
    estimates, warned = [], set()
    for r in points:
        if getattr(r.strategy, "transport", None) == "mpi":
            from suite.submit import mpi

            mpi.check_mpi4py("strategy.transport=mpi")
        r.data.check_available()
        check_device(r)
        check_interface(r.launch)
        check_batch_fits_data(r)
        check_targets(r)
        est = estimate(r)
        check_step(r)
        check_memory(r, est, node, force)
        line = None if slurm else oversubscription(r.launch, node.cores)
        if line and line not in warned:
            print(f"warning: {line}", file=sys.stderr, flush=True)
            warned.add(line)
        estimates.append(est)
    if not dry_run:
        check_disk(points, estimates, Path(out))
    return estimates


# ---- run folder ----------------------------------------------------------------------------

def check_out(out: Path) -> None:
    """``--out`` must be a folder this process can write (created if absent)."""
    if out.exists() and not out.is_dir():
        raise SuiteError(f"--out {out} is a file, not a folder; give a folder for the run records, e.g. --out runs")
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=out).cleanup()
    except OSError as e:
        raise SuiteError(f"--out {out}: cannot write run records there ({e.strerror}); give a folder you can "
                         f"write, e.g. --out runs") from None


def checkpoint_bytes(recipe, est: dict) -> int:
    """A checkpoint's predicted bytes: each rank saves its own parameters and optimizer state."""
    per_rank = est["per_rank"]
    return recipe.world_size * int(per_rank.get("parameters", 0) + per_rank.get("optimizer_state", 0))


def check_disk(points, estimates, out: Path) -> None:
    """Refuse when ``--out`` has less free space than the submission's checkpoints need: twice
    each run's checkpoint, since a new one is written beside the last good one before the switch."""
    need = 2 * sum(checkpoint_bytes(r, est) for r, est in zip(points, estimates))
    free = shutil.disk_usage(out).free
    if need > free:
        raise SuiteError(f"--out {out} has {_size(free)} free, but the checkpoints of this submission are predicted "
                         f"to need {_size(need)} (parameters and optimizer state of every rank, twice: a new "
                         f"checkpoint is written beside the last good one); free space there or give --out a "
                         f"folder on a larger disk")


def _size(n: float) -> str:
    return f"{n / _GIB:.1f} GiB" if n >= 0.1 * _GIB else f"{n / 2**20:.1f} MiB"


# ---- device and data -----------------------------------------------------------------------

def rank_has_gpu(launch) -> bool:
    """Will a rank see a GPU? Local and debug ranks run here; a Slurm rank gets the GPUs it asks for."""
    if launch.executor == "slurm":
        return launch.gpus_per_node > 0
    import torch

    return torch.cuda.is_available()


def check_device(recipe) -> None:
    launch, precision = recipe.launch, recipe.training.precision
    gpu = rank_has_gpu(launch)
    where = "launch.gpus_per_node=0" if launch.executor == "slurm" else "this machine has no GPU"
    if launch.device == "cuda" and not gpu:
        fix = "set launch.gpus_per_node" if launch.executor == "slurm" else "use launch.device=auto or cpu"
        raise SuiteError(f"launch.device=cuda, but {where}; {fix}")
    on_cpu = launch.device == "cpu" or not gpu
    if precision == "fp16" and on_cpu and recipe.strategy.fp16_needs_gpu:
        raise SuiteError(f"training.precision=fp16 with strategy {recipe.strategy.name} needs a GPU "
                         f"({recipe.strategy.fp16_needs_gpu}), but the ranks will run on CPU "
                         f"(launch.device={launch.device}, {where}); use training.precision=bf16 or fp32")


def check_interface(launch) -> None:
    """launch.interface must be an interface of the machine the ranks run on: this one, unless on
    Slurm (there each rank checks it, and its route to the master, in suite.train.dist)."""
    if launch.interface is None or launch.executor == "slurm":
        return
    names = network.interfaces()
    if launch.interface not in names:
        raise SuiteError(f"launch.interface={launch.interface!r} is not an interface of this machine; "
                         f"its interfaces: {', '.join(names)}")


def check_batch_fits_data(recipe) -> None:
    """Each data-parallel rank must get at least one batch from its shard of the training set."""
    sizes = recipe.data.sizes()
    if sizes is None:
        return
    n_train = min(sizes[0], recipe.data.limit_train or sizes[0])
    dp, batch = recipe.layout().dp_size, recipe.training.batch_size
    if n_train // dp < batch // dp:
        raise SuiteError(f"training.batch_size={batch} is larger than the training set: {n_train} samples give each "
                         f"of {dp} data-parallel rank(s) {n_train // dp}, fewer than its {batch // dp}; "
                         f"use training.batch_size <= {n_train // dp * dp}")


def check_targets(recipe) -> None:
    """A segmentation model trains against masks (a class id per pixel), every other model against
    one label per sample (an autoencoder against its input: any data)."""
    from suite.models import source

    task, targets = recipe.model.task, recipe.data.target_kind()
    if task == "segmentation" and targets != "masks":
        raise SuiteError(f"{source(recipe.model)} predicts a class per pixel, but data.name={recipe.data.name} gives "
                         f"one label per sample; use data.name=shapes or segmentation_folder (or data of (N, H, W) masks)")
    if targets == "masks" and task in ("classification", "language"):
        raise SuiteError(f"data.name={recipe.data.name} gives a mask per image (a class id per pixel), but "
                         f"{source(recipe.model)} predicts one {task} output per sample; use model.name=unet or segnet")


def check_step(recipe) -> None:
    """One forward, loss and backward of the model on a batch without values (``suite.models.
    trial``): a model whose output the task cannot score is refused here, not in every rank."""
    if recipe.strategy.owns_training:  # TensorFlow's strategies build their own Keras model
        return
    from suite.models import trial

    trial.check_step(recipe.model, recipe.data.spec())


def estimate(recipe) -> dict:
    """``suite.planner.memory.predicted_held_bytes`` (the model built on the meta device) plus the data's
    bytes; a model that cannot be built for this data is a SuiteError naming both."""
    from suite.planner.memory import predicted_held_bytes

    try:
        est = predicted_held_bytes(recipe)
    except SuiteError:
        raise
    except (RuntimeError, ValueError, TypeError, OverflowError, MemoryError) as e:
        raise SuiteError(f"model.name={recipe.model.name} cannot be built for data.name={recipe.data.name} "
                         f"with these model.* options ({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
    sizes = recipe.data.sizes()
    spec = recipe.data.spec()
    element = 8 if spec.input_dtype == "int64" else 4
    # Every rank loads the whole data set (inputs and int64 targets: a class id per pixel for
    # segmentation) before taking its shard.
    target = math.prod(spec.input_shape[1:]) if recipe.model.task == "segmentation" else 1
    est["data_bytes"] = sum(sizes) * (math.prod(spec.input_shape) * element + 8 * target) if sizes else 0
    return est


# ---- the node: memory and cores ------------------------------------------------------------

class _Node:
    """Memory and cores of the node a rank runs on: this machine, or the Slurm partition's smallest node."""

    def __init__(self, memory_bytes, cores, what, partitions=()):
        self.memory_bytes, self.cores, self.what, self.partitions = memory_bytes, cores, what, partitions
        self.gres: set[str] = set()

    @classmethod
    def of(cls, launch) -> "_Node":
        if launch.executor != "slurm":
            import psutil

            return cls(psutil.virtual_memory().total, len(os.sched_getaffinity(0)), "this machine")
        if not shutil.which("sinfo"):
            raise SuiteError("launch.executor=slurm, but sinfo is not on PATH: this machine is not a Slurm "
                             "submit host; use launch.executor=local, or submit from the cluster")
        rows = [line.split("|") for line in _run(["sinfo", "-h", "-o", "%P|%c|%m|%G"]).splitlines() if line]
        partitions = {p.rstrip("*"): p.endswith("*") for p, *_ in rows}
        chosen = [r for r in rows if r[0].rstrip("*") == launch.partition or (not launch.partition and r[0].endswith("*"))]
        chosen = chosen or rows
        memory = min((int(m.rstrip("+")) * 2**20 for _, _, m, _ in chosen if m.rstrip("+").isdigit()), default=None)
        cores = min((int(c.rstrip("+")) for _, c, _, _ in chosen if c.rstrip("+").isdigit()), default=None)
        node = cls(memory, cores, f"a node of partition {chosen[0][0].rstrip('*')}" if chosen else "a node", partitions)
        node.gres = {g for *_, g in chosen if g and g != "(null)"}
        return node


def check_memory(recipe, est: dict, node: _Node, force: bool) -> None:
    """Refuse (unless ``--force``) when the bytes a node's ranks are predicted to hold exceed its memory."""
    launch = recipe.launch
    limit = launch.mem_gb * 1e9 if launch.mem_gb else node.memory_bytes
    if not limit:
        return
    per_rank = sum(est["per_rank"].values()) + est.get("data_bytes", 0)
    need = per_rank * launch.tasks_per_node
    if need > limit and not force:
        source = "launch.mem_gb" if launch.mem_gb else node.what
        raise SuiteError(f"the model (model.*) and data are predicted to need {per_rank / _GIB:.1f} GiB per rank "
                         f"(parameters, gradients, optimizer state and data, before activations) x "
                         f"{launch.tasks_per_node} rank(s) per node = {need / _GIB:.1f} GiB, more than the "
                         f"{limit / _GIB:.1f} GiB of {source}; shrink the model, lower launch.tasks_per_node, "
                         f"or pass --force to launch anyway")


def oversubscription(launch, cores) -> str | None:
    """The warning for a node whose ranks would run more threads than it has cores, else None.
    Threads per rank: ``launch.cpus_per_task``, else the node's cores shared out (at least 1)."""
    if not cores:
        return None
    threads = launch.cpus_per_task or max(1, cores // launch.tasks_per_node)
    if launch.tasks_per_node * threads <= cores:
        return None
    return (f"launch.tasks_per_node={launch.tasks_per_node} x {threads} thread(s) per rank"
            + (" (launch.cpus_per_task)" if launch.cpus_per_task else "")
            + f" is more than the {cores} core(s) of this machine: ranks will share cores and steps will be "
            f"slower (the run is marked oversubscribed); lower launch.tasks_per_node or launch.cpus_per_task")


# ---- Slurm ---------------------------------------------------------------------------------

def check_slurm(launch, node: _Node) -> None:
    """Partition, account and QoS the cluster knows, GPUs it has, CPUs per node and extra sbatch
    options, checked with sinfo / sacctmgr / ``sbatch --test-only`` before anything is submitted."""
    if launch.partition and launch.partition not in node.partitions:
        raise SuiteError(f"launch.partition={launch.partition!r} is not a partition of this cluster; "
                         f"choose one of: {', '.join(node.partitions)} (sinfo)")
    for key, value, what in (("account", launch.account, ["account", "format=account"]),
                             ("qos", launch.qos, ["qos", "format=name"])):
        known = _sacctmgr(what) if value else None
        if known is not None and value not in known:
            raise SuiteError(f"launch.{key}={value!r} is not known to this cluster's accounting; choose one of: "
                             f"{', '.join(sorted(known))} (sacctmgr show {what[0]})")
    if launch.gpus_per_node and not any("gpu" in g for g in node.gres):
        raise SuiteError(f"launch.gpus_per_node={launch.gpus_per_node}, but the nodes of this cluster have no GPUs "
                         f"(sinfo shows no gpu gres); set launch.gpus_per_node=0")
    if node.cores and launch.cpus_per_task and launch.cpus_per_task * launch.tasks_per_node > node.cores:
        raise SuiteError(f"launch.cpus_per_task={launch.cpus_per_task} x launch.tasks_per_node={launch.tasks_per_node} "
                         f"is more than the {node.cores} CPUs of {node.what}; lower them")
    _sbatch_test(launch)


def _sbatch_test(launch) -> None:
    args = ["sbatch", "--test-only", f"--nodes={launch.nodes}", f"--ntasks-per-node={launch.tasks_per_node}",
            f"--time={launch.timeout_min}"]
    args += [f"--{k}={v}" for k, v in (("partition", launch.partition), ("account", launch.account), ("qos", launch.qos),
                                       ("constraint", launch.constraint), ("cpus-per-task", launch.cpus_per_task)) if v]
    if launch.mem_gb:
        args.append(f"--mem={max(1, int(launch.mem_gb * 1024))}M")
    # submitit writes each extra option as #SBATCH --<key with _ as ->=<value>
    args += [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in launch.sbatch_extra.items()]
    proc = subprocess.run([*args, "--wrap", "true"], capture_output=True, text=True, timeout=60)
    text = " ".join((proc.stderr + proc.stdout).split())
    if proc.returncode == 0 and "error" not in text.lower() and "failure" not in text.lower():
        return
    for option in launch.sbatch_extra:
        if f"'--{option.replace('_', '-')}" in text:
            raise SuiteError(f"launch.sbatch_extra.{option}: sbatch does not know the option --{option.replace('_', '-')} "
                             f"(sbatch --help lists them); remove or correct it")
    key = next((k for word, k in (("partition", "launch.partition"), ("account", "launch.account"),
                                  ("qos", "launch.qos"), ("gres", "launch.gpus_per_node"),
                                  ("constraint", "launch.constraint"), ("feature", "launch.constraint"),
                                  ("node configuration", "launch (nodes, tasks_per_node, cpus_per_task, mem_gb)"),
                                  ("time limit", "launch.timeout_min")) if word in text.lower()),
               "launch.sbatch_extra")
    raise SuiteError(f"sbatch refuses the settings of {key}: {text[:200]}; correct them (slurm/README.md)")


def _sacctmgr(what: list[str]) -> set[str] | None:
    """Names sacctmgr lists, or None when there is no accounting to ask."""
    if not shutil.which("sacctmgr"):
        return None
    try:
        proc = subprocess.run(["sacctmgr", "-n", "-P", "show", *what], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    names = {line.strip() for line in proc.stdout.splitlines() if line.strip()}
    return names if proc.returncode == 0 and names else None


def _run(args: list[str]) -> str:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SuiteError(f"{args[0]} did not answer ({e}); is the Slurm controller up? (slurm/README.md)") from None
    if proc.returncode:
        raise SuiteError(f"{' '.join(args)} failed: {' '.join(proc.stderr.split())[:200]}; is the Slurm controller up?")
    return proc.stdout
