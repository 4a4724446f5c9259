"""TensorFlow ``MirroredStrategy`` with Keras ``fit``: one process, one replica per device, the
global batch split over them and the gradients all-reduced before each step.

On a host without GPUs MirroredStrategy has only ``/cpu:0`` and so one replica: it would train
exactly as ``tf_single``. To mirror on a CPU the process is given ``cpu_replicas`` logical CPU
devices (``tf.config.set_logical_device_configuration``, before TensorFlow starts); they share the
process's cores and thread pool, so the replicas are real (variables copied per device, gradients
all-reduced by collective ops) but do not add compute. With GPUs, every visible GPU is a replica.

``training.grad_clip_norm`` is refused: Keras's optimizer clips the gradients it is given, which
under a distribution strategy are each replica's, before the replicas' are summed (Keras 3.15's
``_backend_apply_gradients`` clips, then its TensorFlow update step all-reduces), so the norm
would be a replica's, not the whole batch's gradient's. ``tf_mirrored_loop`` clips by the sum's.
"""
from typing import ClassVar, Literal

from suite.strategies._tensorflow import TF_REFUSES, MirroredOptions
from suite.strategies._tf_train import train_fit
from suite.strategies.keys import Refused


class Options(MirroredOptions):
    name: Literal["tf_mirrored"] = "tf_mirrored"
    refuses: ClassVar = TF_REFUSES + (
        Refused("training.grad_clip_norm", (None,), "Keras fit under MirroredStrategy clips each replica's gradients "
                "before they are summed, not the whole batch's; use tf_mirrored_loop or tf_single"),)


def train(opts: Options, recipe, ctx, train_set, val_set, log):
    return train_fit(recipe, ctx, train_set, val_set, log, opts.mirrored, cpu_devices=opts.cpu_replicas)
