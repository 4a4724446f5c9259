"""The two ways the TensorFlow strategies train (``suite.strategies._tensorflow`` holds what else
they share): Keras ``fit`` under a distribution strategy's scope, what a Keras user writes
(``tf_single``, ``tf_mirrored``), and a hand-written ``tf.function`` step under one (``tf_mirrored_loop``,
``tf_multiworker``). Each records its steps and epochs in the suite's run record (``TFRun``)."""
from __future__ import annotations

import functools
import shutil
import tempfile
import time

import torch

from suite.common.errors import SuiteError
from suite.common.scratch import temp_folder
from suite.strategies._tensorflow import (TFEngine, TFRun, build_model, build_optimizer, clip_to_global_norm,
                                          datasets, evaluate_due, new_run, start_tf)
from suite.strategies.keys import check as check_keys


def _start(recipe, ctx, make_strategy, cpu_devices: int, clip: float | None = None):
    """TensorFlow, the strategy (created first: MultiWorkerMirroredStrategy must precede any op),
    then the seeds, then the model and optimizer (Keras clipping by ``clip``) inside the strategy's scope."""
    check_keys(recipe)  # as validation did: a recipe built without it still cannot run what Keras ignores
    tf = start_tf(torch.get_num_threads(), cpu_devices)
    import keras
    strategy = make_strategy(tf)
    if clip is not None and strategy is not None:
        raise SuiteError(f"strategy.name={recipe.strategy.name}: Keras would clip each replica's gradients, "
                         f"not their sum's (an internal error: this recipe should have been refused)")
    keras.backend.clear_session()  # nothing of an earlier run in this warm process (its layers' names)
    keras.utils.set_random_seed(recipe.training.seed)
    with strategy.scope() if strategy else _no_scope():
        model, optimizer = build_model(recipe), build_optimizer(recipe, clip)
        # Its slots now, in the scope: built lazily inside a replica's tf.function step it fails.
        optimizer.build(model.trainable_variables)
    return tf, keras, strategy, model, optimizer


class _no_scope:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def in_own_temp_folder(train):
    """Run ``train`` with the temp folder set to one of this rank's own, removed when it returns.
    TensorFlow's autograph writes each function it converts to a file in the temp folder and leaves
    its removal to ``atexit``, which a rank that ends with ``os._exit`` (the local executor's warm
    ranks, ``suite.tasks.pool``) never runs: one CI run left 43 such files in /tmp. The modules
    are loaded by then; nothing reads the files again."""
    @functools.wraps(train)
    def wrapped(*args, **kwargs):
        folder = tempfile.mkdtemp(prefix="scalesuite-tf-")
        try:
            with temp_folder(folder):
                return train(*args, **kwargs)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return wrapped


@in_own_temp_folder
def train_fit(recipe, ctx, train_set, val_set, log, make_strategy, cpu_devices: int = 1) -> TFRun:
    """Keras ``fit`` (under ``make_strategy(tf)``'s scope, or none): what a Keras user writes.
    Keras reports each metric as its running mean over the epoch, so a step's own loss is taken
    back out of two consecutive means: (b+1)*mean_b - b*mean_(b-1), exact for equal batches up to
    float32 rounding of the means (about 1e-7 x the step index)."""
    tf, keras, strategy, model, optimizer = _start(recipe, ctx, make_strategy, cpu_devices,
                                                   clip=recipe.training.grad_clip_norm)
    with strategy.scope() if strategy else _no_scope():
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    train, val, steps = datasets(tf, recipe, train_set, val_set)
    run = new_run(ctx, recipe, log, TFEngine(ctx, strategy, model, optimizer, "keras fit"), steps)
    model.fit(train, epochs=recipe.training.epochs, steps_per_epoch=steps, verbose=0, shuffle=False,
              callbacks=[_recorder(keras, run, ctx, recipe, model, val)])
    return run


def _recorder(keras, run: TFRun, ctx, recipe, model, val):
    class Recorder(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch, self.epoch_t0, self.mean = epoch, time.perf_counter(), 0.0

        def on_train_batch_begin(self, batch, logs=None):
            self.step_t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            step_time_s = time.perf_counter() - self.step_t0  # logs are read back: the step has ended
            mean = float(logs["loss"])
            run.log_step(ctx, recipe, self.epoch, (batch + 1) * mean - batch * self.mean, step_time_s)
            self.mean = mean

        def on_epoch_end(self, epoch, logs=None):
            record = {"epoch": epoch, "epoch_time_s": time.perf_counter() - self.epoch_t0,
                      "train_loss": float(logs["loss"]), "train_accuracy": float(logs["accuracy"])}
            if evaluate_due(recipe, epoch):  # outside the epoch's time, as in the torch loop
                t0 = time.perf_counter()
                result = model.evaluate(val, verbose=0, return_dict=True)
                record.update(val_loss=float(result["loss"]), val_accuracy=float(result["accuracy"]),
                              eval_time_s=time.perf_counter() - t0)
            run.log_epoch(ctx, recipe, record)

    return Recorder()


@in_own_temp_folder
def train_loop(recipe, ctx, train_set, val_set, log, make_strategy, cpu_devices: int = 1) -> TFRun:
    """A hand-written ``tf.function`` step under a distribution strategy: each replica computes
    its loss scaled by the global batch (``compute_average_loss``), the Keras optimizer sums the
    replicas' gradients before it steps, and ``strategy.reduce`` sums the replicas' losses into
    the step's global mean loss (what the record needs, exactly, without running means).
    ``training.grad_clip_norm`` clips by the norm of that sum, the whole batch's gradient, as
    tf_single's Keras clip does (``clip_to_global_norm``)."""
    tf, keras, strategy, model, optimizer = _start(recipe, ctx, make_strategy, cpu_devices)
    train, val, steps = datasets(tf, recipe, train_set, val_set)
    run = new_run(ctx, recipe, log, TFEngine(ctx, strategy, model, optimizer, "tf.function loop"), steps)
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    batch, clip = recipe.training.batch_size, recipe.training.grad_clip_norm
    total = lambda v: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)

    def correct(logits, y):
        return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), tf.cast(y, tf.int64)), tf.float32))

    def replica_train(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.nn.compute_average_loss(per_sample(y, logits), global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        if clip is not None:
            grads = clip_to_global_norm(tf, grads, clip)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, correct(logits, y)

    def replica_eval(x, y):
        logits = model(x, training=False)
        return tf.reduce_sum(per_sample(y, logits)), correct(logits, y), tf.cast(tf.shape(y)[0], tf.float32)

    @tf.function
    def train_step(inputs):
        return [total(v) for v in strategy.run(replica_train, args=inputs)]

    @tf.function
    def eval_step(inputs):
        return [total(v) for v in strategy.run(replica_eval, args=inputs)]

    stream, dist_val = iter(strategy.experimental_distribute_dataset(train)), strategy.experimental_distribute_dataset(val)
    for epoch in range(recipe.training.epochs):
        epoch_t0, losses, right = time.perf_counter(), [], 0.0
        for _ in range(steps):
            inputs = next(stream)
            t0 = time.perf_counter()
            loss, step_correct = (float(v) for v in train_step(inputs))  # float(): waits for the step
            run.log_step(ctx, recipe, epoch, loss, time.perf_counter() - t0)
            losses.append(loss)
            right += step_correct
        record = {"epoch": epoch, "epoch_time_s": time.perf_counter() - epoch_t0,
                  "train_loss": sum(losses) / len(losses), "train_accuracy": right / (len(losses) * batch)}
        if evaluate_due(recipe, epoch):
            t0, sums = time.perf_counter(), [0.0, 0.0, 0.0]
            for inputs in dist_val:
                sums = [a + float(b) for a, b in zip(sums, eval_step(inputs))]
            record.update(val_loss=sums[0] / sums[2], val_accuracy=sums[1] / sums[2], eval_time_s=time.perf_counter() - t0)
        run.log_epoch(ctx, recipe, record)
    return run
