"""``model: {target: "mypkg.nets:build", width: 64}`` (``name: custom`` implied): a model built by a
callable found by import path (``suite.common.factories``), with the keyword arguments written beside
``target`` (as Hydra's ``_target_`` reads them) or under ``kwargs``.

Two kinds of callable, told apart by their signature (``suite.common.factories.takes_spec``):
- a suite factory, whose first parameter is ``spec`` (or annotated ``DataSpec``): called as
  ``factory(spec, **kwargs)`` with the data's ``DataSpec``, like every built-in model's ``build``;
- anything else, a library's constructor such as ``torchvision.models:resnet18`` or a module
  class: called as ``constructor(**kwargs)``, so ``num_classes: 10`` is the recipe's to give.
Either returns an ``nn.Module`` (``docs/plugins.md``). A constructor that passes ``**kwargs`` on
(torchvision's builders hand them to the model class) cannot be checked by its signature, so it
is called once on the meta device when the recipe is validated: a misspelt argument is then one
line naming it, before launch, not a traceback in every rank."""
import re
import warnings
from typing import ClassVar, Literal, Optional

from pydantic import ConfigDict, model_validator

from suite.common.errors import SuiteError
from suite.common.factories import TargetOptions, takes_spec
from suite.models.base import ModelOptions
from suite.models.empty import on_meta

_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")

with warnings.catch_warnings():
    # ``task`` is a class constant of the built-ins and a recipe field here: the shadowing is meant.
    warnings.filterwarnings("ignore", message='Field name "task"')

    class Custom(TargetOptions, ModelOptions):
        # Keys beside target that are none of the fields below are the callable's keyword arguments.
        model_config = ConfigDict(extra="allow")
        name: Literal["custom"] = "custom"
        section: ClassVar = "model"
        fixed_args: ClassVar = ("spec",)
        task: Literal["classification", "reconstruction", "language", "segmentation"] = "classification"
        # language: "task" scores with the suite's loss (each sequence weighs the same), "model" with
        # a Hugging Face model's own (its .loss with labels: the mean over the batch's scored tokens)
        loss: Literal["task", "model"] = "task"
        # strategy tensor: {module path (* for any index): colwise | rowwise | colwise_gather_output},
        # where the model publishes no plan of its own (suite.models.hf.tensor_parallel_plan)
        tp_plan: Optional[dict[str, str]] = None

        def calls_with_spec(self) -> bool:
            return takes_spec(self.factory())

        def fixed(self) -> tuple[str, ...]:
            return self.fixed_args if self.calls_with_spec() else ()

        def beside(self) -> set[str]:
            return set(self.model_extra or {})

        def factory_kwargs(self) -> dict:
            return {**self.kwargs, **(self.model_extra or {})}

        @model_validator(mode="after")
        def _arguments_build(self):
            """Both ways of giving an argument at once is ambiguous; a constructor whose signature
            takes ``**kwargs`` is tried on the meta device (no memory, no initialisation)."""
            if self.loss == "model" and self.task != "language":
                raise SuiteError(f"model.loss=model takes a language model's own loss, and model.task={self.task}; "
                                 f"set model.loss=task")
            twice = sorted(self.beside() & set(self.kwargs))
            if twice:
                raise SuiteError(f"model.{twice[0]} is given both beside model.target and in model.kwargs; "
                                 f"keep one of them")
            if not self.calls_with_spec() and self.factory_kwargs():
                try_build(self)
            return self


def try_build(options: Custom) -> None:
    """Call the constructor with the recipe's arguments on the meta device; a TypeError (an argument
    it does not take, or of the wrong kind) becomes a SuiteError naming the key. Anything else is
    left to the build in the rank, which says what went wrong: a model may need real values."""

    kwargs = options.factory_kwargs()
    try:
        on_meta(lambda: options.factory()(**kwargs))
    except TypeError as e:
        message = " ".join(str(e).split())[:200]
        bad = _UNEXPECTED.search(message)
        if bad and bad.group(1) in kwargs:
            name = bad.group(1)
            key = f"model.{name}" if name in options.beside() else f"model.kwargs.{name}"
            raise SuiteError(f"{key}: {options.target} does not accept {name} ({message}); fix or remove it") from None
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise SuiteError(f"model.target={options.target} cannot be built with {given} ({message}); "
                         f"fix the arguments") from None
    except Exception:  # noqa: BLE001 - not an argument problem: the rank's real build reports it
        pass


OPTIONS = [Custom]
build = None  # the recipe's model.target is the factory
