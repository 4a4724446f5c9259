"""What the TensorFlow strategies share (``tf_single``, ``tf_mirrored``, ``tf_mirrored_loop``,
``tf_multiworker``): the Keras twin of the suite's ``mlp``, the suite's own data as tf.data and the
run record; the two ways to train (Keras ``fit`` or a hand-written ``tf.function`` loop) are in
``_tf_train``.

These strategies bring their own training loop (``owns_training``): the rank joins the torch
process group as always (run folder, barriers, summary gathering stay the suite's), reads the data
through the suite's readers, and hands the whole run to the strategy's ``train``. What comes back
has the fields ``suite.train.rank`` writes into ``summary.json``, so analysis/ reads these runs as
it reads PyTorch ones. TensorFlow is imported in the rank only, never while a recipe is read.

Not supported, and refused when the recipe is validated (``TF_REFUSES``, checked by
``suite.strategies.keys``): models other than ``mlp``, precision other than fp32, gradient
accumulation, lr schedules, ``max_steps``, checkpoints and resuming, activation checkpointing,
``training.compile``, augmentation, and weight decay where Keras's differs from torch's.
``training.grad_clip_norm`` is honoured by ``tf_single`` (Keras's ``global_clipnorm``, in one
process the norm torch clips by) and by the hand-written loop (``tf_mirrored_loop``,
``tf_multiworker``: the norm of the gradient summed over the replicas); ``tf_mirrored`` refuses
it, since Keras ``fit`` under a distribution strategy clips each replica's gradient before the
replicas' are summed.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import time
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import PositiveInt

from suite.common.errors import SuiteError
from suite.common.ports import free_port
from suite.record import console
from suite.strategies import costs
from suite.strategies.base import StrategyOptions, refuse_world_size
from suite.strategies.engine import Engine
from suite.strategies.keys import Refused
import torch.distributed as dist
from torch.utils.data import DataLoader
import numpy as np

INSTALL = 'pip install -e ".[tensorflow]"'


def _augmenting(recipe) -> bool:
    return getattr(getattr(recipe.data, "augment", None), "active", False)


# What the Keras runs do not implement, refused by recipe key when the recipe is validated
# (suite.strategies.keys); training.precision=fp64 has its own declaration (no_fp64).
TF_REFUSES = (
    Refused("training.precision", ("fp32",), "the Keras model trains in float32"),
    Refused("training.grad_accumulation", (1,), "Keras steps once per batch"),
    Refused("training.max_steps", (None,), "the Keras runs train whole epochs (set training.epochs)"),
    Refused("training.checkpoint_every_steps", (0,), "the Keras runs save no checkpoints and cannot resume"),
    Refused("training.fail_at", ("",), "a planned fault is injected by the suite's own loop, which the Keras runs do not use"),
    Refused("optimizer.schedule", ({},), "the Keras optimizer keeps optimizer.lr throughout",
            read=lambda r: r.optimizer.schedule.model_dump(exclude_defaults=True)),
    Refused("training.activation_checkpointing", (False,), "the Keras model keeps its activations"),
    Refused("training.compile", (False,), "torch.compile has no Keras model to compile (Keras traces its "
            "step with tf.function anyway)"),
    Refused("optimizer.weight_decay", (0,), "Keras Adam decays the weights apart from the gradient, torch Adam "
            "adds the decay to it; use optimizer.name=adamw (decoupled in both)", when=lambda r: r.optimizer.name == "adam"),
    Refused("optimizer.weight_decay", (0,), "with momentum, Keras SGD decays the weights apart from the momentum, "
            "torch SGD adds the decay to the gradient the momentum accumulates; set optimizer.momentum=0",
            when=lambda r: r.optimizer.name == "sgd" and r.optimizer.momentum != 0),
    Refused("data.augment", (False,), "the Keras runs read the data set unaugmented", read=_augmenting),
    Refused("training.init_perturbation", (0,), "Keras initialises the Keras model; the suite's nudge of the "
            "initial weights acts on torch models", read=lambda r: getattr(r.training, "init_perturbation", 0)),
)


class TFOptions(StrategyOptions):
    """A TensorFlow strategy: the rank hands it the run (``owns_training``)."""
    owns_training: ClassVar[bool] = True
    # A repeat (a sweep's next point) trains in the same process, TensorFlow already imported
    # (most of a short run's time), where it asks for the same threads and devices
    # (``process_state``): TensorFlow fixes them when it starts. Not tf_multiworker.
    reusable_process: ClassVar[bool] = True
    refuses: ClassVar = TF_REFUSES
    no_fp64: ClassVar[str] = "TensorFlow's strategies train the Keras model in float32"
    one_process: ClassVar[bool] = True  # tf_multiworker: one worker per rank instead
    # The planner's rules, shared by the TensorFlow strategies (tf_single has no collectives).
    overlap: ClassVar = costs.NOTHING_HIDDEN
    # Tried; a TensorFlow strategy has no Engine to build on fake tensors (it owns its training),
    # so the plan falls back to the analytic rule, saying so in its notes.
    cannot_fake: ClassVar = "TensorFlow trains the model's Keras twin: no torch engine runs on fake tensors"

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        return costs.data_parallel_all_reduce(step)  # replicas' or workers' gradients all-reduced

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return []  # nothing to choose

    def cpu_devices(self) -> int:
        """Logical CPU devices the process is given where it has no GPU (``start_tf``)."""
        return 1

    def process_state(self, launch) -> tuple:
        return ("tensorflow", launch.cpus_per_task, self.cpu_devices())

    def check(self, layout, model) -> None:
        if importlib.util.find_spec("tensorflow") is None:
            raise SuiteError(f"strategy.name={self.name} needs TensorFlow, which is not installed; {INSTALL}")
        if model.name != "mlp":
            raise SuiteError(f"strategy.name={self.name} trains the Keras twin of model.name=mlp only, "
                             f"but the recipe has {model.source}; use model.name=mlp or a PyTorch strategy")
        if self.one_process and layout.world_size != 1:
            refuse_world_size(self.name, layout.world_size, "runs in one process (its replicas are devices of "
                              "that process)", "set launch.tasks_per_node=1, or use tf_multiworker")


class MirroredOptions(TFOptions):
    """One process, MirroredStrategy over its devices: every GPU, or without one ``cpu_replicas``
    logical CPU devices (see ``tf_mirrored``)."""
    cpu_replicas: PositiveInt = 2  # logical CPU devices to mirror over when the host has no GPU

    def cpu_devices(self) -> int:
        return self.cpu_replicas

    def check(self, layout, model) -> None:
        super().check(layout, model)
        if layout.batch_size % self.cpu_replicas:  # Keras splits 32 as 11/11/10; its all-reduce then fails
            raise SuiteError(f"strategy.name={self.name} splits each batch over strategy.cpu_replicas="
                             f"{self.cpu_replicas} replicas on a CPU, which must divide training.batch_size="
                             f"{layout.batch_size}; set strategy.cpu_replicas to a divisor of it (e.g. 2)")

    def mirrored(self, tf):
        return tf.distribute.MirroredStrategy()


# ---- the rank's TensorFlow -----------------------------------------------------------------------

_STARTED: list = []  # the (threads, cpu_devices) TensorFlow was started with in this process


def start_tf(threads: int, cpu_devices: int = 1):
    """Import TensorFlow configured before its runtime starts (afterwards it refuses changes):
    this rank's thread budget and, for one-process mirroring on a CPU, ``cpu_devices`` logical CPUs.
    A later run in the same warm process finds it started as it asks (the pool gives a run that
    asks otherwise a new process: ``process_state``)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no C++ info lines in the run's log
    import tensorflow as tf
    if _STARTED:
        if _STARTED[0] != (threads, cpu_devices):
            raise SuiteError(f"TensorFlow in this process was started with (threads, cpu devices) {_STARTED[0]}, and "
                             f"this run asks for {(threads, cpu_devices)}; it cannot change them (an internal error: "
                             f"the run should have been given a process of its own)")
        return tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    if cpu_devices > 1 and not tf.config.list_physical_devices("GPU"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_devices)
    _STARTED.append((threads, cpu_devices))
    return tf


def write_tf_config(ctx) -> dict:
    """TF_CONFIG for MultiWorkerMirroredStrategy from the suite's rank and world: every rank takes
    a free port on its host, the ranks exchange them over the torch process group, worker i is rank i."""
    host = "127.0.0.1" if ctx.local_world_size == ctx.world_size else socket.getfqdn()
    mine = f"{host}:{free_port(host if host == '127.0.0.1' else '')}"
    workers = [None] * ctx.world_size
    dist.all_gather_object(workers, mine)
    config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": ctx.rank}}
    os.environ["TF_CONFIG"] = json.dumps(config)
    return config


def arrays(dataset):
    """A suite dataset (inputs, targets) as two numpy arrays: the same samples the torch runs read."""
    x, y = next(iter(DataLoader(dataset, batch_size=len(dataset))))
    return x.numpy(), y.numpy()


def datasets(tf, recipe, train_set, val_set):
    """(training stream, validation set, steps per epoch) as tf.data at the global batch; a
    distributed strategy splits each global batch over its replicas (and shards over workers).

    The stream holds every epoch, each shuffled by (seed, epoch) alone and read through ONE
    iterator. A dataset reshuffled per iteration would instead advance its order with every
    iterator made of it, and Keras ``fit`` under a strategy makes an extra one to peek at a batch
    before training: tf_mirrored would then train on other batches than tf_single."""
    (x, y), (vx, vy) = arrays(train_set), arrays(val_set)
    tr = recipe.training
    if len(x) < tr.batch_size:
        raise SuiteError(f"training.batch_size={tr.batch_size} is larger than the training set "
                         f"({len(x)} samples); lower it")
    samples = tf.data.Dataset.from_tensor_slices((x, y))

    def epoch(index):
        return (samples.shuffle(len(x), seed=tr.seed * 1000 + index, reshuffle_each_iteration=False)
                .batch(tr.batch_size, drop_remainder=True))
    train = epoch(0)
    for index in range(1, tr.epochs):
        train = train.concatenate(epoch(index))
    train = train.prefetch(2)
    val = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(max(tr.batch_size, 256))
    options = tf.data.Options()  # split by element: each worker gets its part of every global batch
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return train.with_options(options), val.with_options(options), len(x) // tr.batch_size


def build_model(recipe):
    """The Keras twin of the suite's mlp: Flatten, then Dense(h, relu) [+ Dropout] per hidden
    width, then Dense(classes) giving logits (the loss applies the softmax, as in torch)."""
    import keras
    spec, m = recipe.data.spec(), recipe.model
    layers = [keras.Input(spec.input_shape), keras.layers.Flatten()]
    for h in m.hidden:
        layers.append(keras.layers.Dense(h, activation="relu"))
        if m.dropout:
            layers.append(keras.layers.Dropout(m.dropout))
    layers.append(keras.layers.Dense(spec.num_classes))
    return keras.Sequential(layers)


def build_optimizer(recipe, clip: float | None = None):
    """The recipe's optimizer with torch's defaults where Keras's differ (Adam's epsilon 1e-8).
    ``clip``: Keras's ``global_clipnorm``, which scales the gradients by min(1, clip / norm) as
    torch's clip_grad_norm_ does (without its 1e-6 in the denominator), before weight decay. It
    norms the gradients the optimizer is given: under a distribution strategy a replica's own,
    before the replicas' are summed, so only a run without one may pass it (``train_fit``)."""
    import keras
    o = recipe.optimizer
    if o.name == "sgd":
        return keras.optimizers.SGD(o.lr, momentum=o.momentum, weight_decay=o.weight_decay or None,
                                    global_clipnorm=clip)
    if o.name == "adam":
        return keras.optimizers.Adam(o.lr, beta_1=o.betas[0], beta_2=o.betas[1], epsilon=1e-8, global_clipnorm=clip)
    return keras.optimizers.AdamW(o.lr, weight_decay=o.weight_decay, beta_1=o.betas[0], beta_2=o.betas[1], epsilon=1e-8,
                                  global_clipnorm=clip)


def clip_to_global_norm(tf, grads, clip: float):
    """This replica's part of the gradient, scaled so that the SUM over the replicas (what the
    optimizer applies: it all-reduces them) has a global L2 norm of at most ``clip``. The norm is
    the sum's, so the replicas all-reduce once more here; every replica scales its part by the
    same factor, which scales the sum by it. The factor is Keras's ``clip_by_global_norm``'s
    (``clip x min(1/norm, 1/clip)``), so a replicated run clips as tf_single does."""
    summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
    norm = tf.linalg.global_norm(summed)
    scale = clip * tf.minimum(1.0 / norm, 1.0 / clip)
    return [g * scale for g in grads]


# ---- what the rank writes into summary.json ------------------------------------------------------

class TFEngine(Engine):
    """What the summary asks of an engine: data shards, bytes held, the TF facts of this rank."""

    def __init__(self, ctx, strategy, model, optimizer, kind: str):
        import tensorflow as tf
        self.dp_rank, self.dp_size = ctx.rank, ctx.world_size  # processes reading different shards
        self.replicas = strategy.num_replicas_in_sync if strategy else 1
        self.local_replicas = self.replicas // ctx.world_size
        self._facts = {"tensorflow": tf.__version__, "loop": kind, "replicas": self.replicas,
                       "devices": list(strategy.extended.worker_devices) if strategy else ["/cpu:0"]}
        self._model, self._optimizer = model, optimizer

    def held_bytes(self) -> dict:
        params = _bytes(self._model.trainable_variables)
        state = _bytes(v for v in self._optimizer.variables if len(v.shape))  # not the step counter
        # Each replica on this rank holds a full copy of the parameters, gradients and Adam moments.
        return {"parameters": params * self.local_replicas, "gradients": params * self.local_replicas,
                "optimizer_state": state * self.local_replicas}

    def extra_metrics(self) -> dict:
        return self._facts


def _bytes(variables) -> int:
    import keras
    return sum(math.prod(v.shape) * np.dtype(keras.backend.standardize_dtype(v.dtype)).itemsize for v in variables)


@dataclass
class TFRun:
    """The fields ``suite.train.rank._write_summary`` reads of a loop, filled by a TF run."""
    engine: TFEngine
    log: object  # the rank's RankLog
    step: int = 0
    samples: int = 0
    train_time_s: float = 0.0
    step_times_s: list = field(default_factory=list)
    epochs: list = field(default_factory=list)
    attempts: list = field(default_factory=list)
    total_steps: int = 0

    def log_step(self, ctx, recipe, epoch: int, loss: float, step_time_s: float) -> None:
        """One step's record, as the torch loop writes it. The loss is the global one; this rank's
        own is not seen (Keras and ``strategy.reduce`` return only the reduced value), so it is
        recorded as both ``global_loss`` and ``loss``."""
        self.log.log("step", attempt=1, step=self.step, epoch=epoch, global_loss=loss, loss=loss,
                     samples=recipe.training.batch_size // ctx.world_size, step_time_s=step_time_s,
                     lr=recipe.optimizer.lr)
        self.step_times_s.append(step_time_s)
        self.step += 1
        self.samples += recipe.training.batch_size
        if ctx.is_main and self.step % recipe.training.log_every_steps == 0:
            rate = recipe.training.batch_size / max(1e-9, step_time_s)
            print(console.step_line(self.step, self.total_steps, loss, rate), flush=True)

    def log_epoch(self, ctx, recipe, record: dict) -> None:
        self.log.log("epoch", attempt=1, **record)
        self.epochs.append(record)
        self.train_time_s += record["epoch_time_s"]
        if ctx.is_main:
            print(console.epoch_line(record, recipe.training.epochs), flush=True)


def new_run(ctx, recipe, log, engine, steps_per_epoch: int) -> TFRun:
    run = TFRun(engine=engine, log=log, total_steps=steps_per_epoch * recipe.training.epochs)
    run.attempts.append({"attempt": 1, "started_at": time.time(), "from_step": 0, "slurm_restart_count": 0})
    return run


def evaluate_due(recipe, epoch: int) -> bool:
    every = recipe.training.eval_every_epochs
    return bool(every) and ((epoch + 1) % every == 0 or epoch == recipe.training.epochs - 1)
