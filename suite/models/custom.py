"""``model: {name: custom, target: "mypkg.nets:build", kwargs: {...}, task: classification}``:
a model built by the user's factory, found by import path (``suite.factories``).

The factory is called as ``factory(spec, **kwargs)`` with the data's ``DataSpec``, like every
built-in model's ``build``; it returns an ``nn.Module`` (``docs/plugins.md``)."""
import warnings
from typing import ClassVar, Literal

from suite.factories import TargetOptions
from suite.models.base import ModelOptions

with warnings.catch_warnings():
    # ``task`` is a class constant of the built-ins and a recipe field here: the shadowing is meant.
    warnings.filterwarnings("ignore", message='Field name "task"')

    class Custom(TargetOptions, ModelOptions):
        name: Literal["custom"] = "custom"
        section: ClassVar = "model"
        fixed_args: ClassVar = ("spec",)
        task: Literal["classification", "reconstruction", "language", "segmentation"] = "classification"


OPTIONS = [Custom]
build = None  # the recipe's model.target is the factory
