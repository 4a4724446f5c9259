"""TensorFlow, one process, no distribution strategy: Keras ``fit``, as the published comparison's
"without MPI" baseline ran it. The Keras twin of ``mlp`` (``suite.strategies._tensorflow``)."""
from typing import ClassVar, Literal

from suite.strategies import costs
from suite.strategies._tensorflow import TFOptions
from suite.strategies._tf_train import train_fit


class Options(TFOptions):
    name: Literal["tf_single"] = "tf_single"
    overlap: ClassVar = costs.NO_COMMUNICATION

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        return {}  # one process, no distribution strategy: nothing to send


def train(opts: Options, recipe, ctx, train_set, val_set, log):
    return train_fit(recipe, ctx, train_set, val_set, log, make_strategy=lambda tf: None)
