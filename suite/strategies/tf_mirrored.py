"""TensorFlow ``MirroredStrategy`` with Keras ``fit``: one process, one replica per device, the
global batch split over them and the gradients all-reduced before each step.

On a host without GPUs MirroredStrategy has only ``/cpu:0`` and so one replica: it would train
exactly as ``tf_single``. To mirror on a CPU the process is given ``cpu_replicas`` logical CPU
devices (``tf.config.set_logical_device_configuration``, before TensorFlow starts); they share the
process's cores and thread pool, so the replicas are real (variables copied per device, gradients
all-reduced by collective ops) but do not add compute. With GPUs, every visible GPU is a replica.
"""
from typing import Literal

from suite.strategies._tensorflow import MirroredOptions, train_fit


class Options(MirroredOptions):
    name: Literal["tf_mirrored"] = "tf_mirrored"


def train(opts: Options, recipe, ctx, train_set, val_set, log):
    return train_fit(recipe, ctx, train_set, val_set, log, opts.mirrored, cpu_devices=opts.cpu_replicas)
