"""TensorFlow ``MirroredStrategy`` with a hand-written ``tf.function`` training loop
(``strategy.run`` per replica, ``strategy.reduce`` of the losses): the published comparison's
"custom data-parallel loop". Replicas as in ``tf_mirrored`` (logical CPU devices without a GPU)."""
from typing import Literal

from suite.strategies._tensorflow import MirroredOptions
from suite.strategies._tf_train import train_loop


class Options(MirroredOptions):
    name: Literal["tf_mirrored_loop"] = "tf_mirrored_loop"


def train(opts: Options, recipe, ctx, train_set, val_set, log):
    return train_loop(recipe, ctx, train_set, val_set, log, opts.mirrored, cpu_devices=opts.cpu_replicas)
