"""TensorFlow ``MultiWorkerMirroredStrategy``: one worker per suite rank (local processes or Slurm
tasks, as any strategy's ranks). The suite writes TF_CONFIG from the rank and world
(``_tensorflow.write_tf_config``: each rank's host and a free port, exchanged over the torch
process group); TensorFlow's collectives then run between the workers over gRPC, each worker
reading its part of every global batch.

It trains with the hand-written ``tf.function`` loop (as ``tf_mirrored_loop``), not Keras ``fit``:
with Keras 3 (TensorFlow >= 2.16; measured with 2.21 / Keras 3.15) ``fit`` under this strategy fails
at its first step ("Attempt to convert a value (PerReplica ...) with an unsupported type to a
Tensor"), TensorFlow's own multi-worker Keras tutorial included (keras-team/keras issue 20585,
tensorflow/tensorflow issue 72388, open).
"""
from typing import ClassVar, Literal

from suite.strategies._tensorflow import TFOptions, write_tf_config
from suite.strategies._tf_train import train_loop


class Options(TFOptions):
    name: Literal["tf_multiworker"] = "tf_multiworker"
    one_process: ClassVar = False
    # Its collective ops and TF_CONFIG's cluster are set once per process: a new process per run.
    reusable_process: ClassVar = False


def train(opts: Options, recipe, ctx, train_set, val_set, log):
    write_tf_config(ctx)
    return train_loop(recipe, ctx, train_set, val_set, log,
                      make_strategy=lambda tf: tf.distribute.MultiWorkerMirroredStrategy())
