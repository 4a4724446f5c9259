"""What every model's recipe options share (the registry and its contract: ``suite/models/__init__.py``)."""
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from suite.common.errors import SuiteError
from suite.models import MODELS


class ModelOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # What the model's output is compared with: "classification" (targets, cross-entropy,
    # accuracy), "reconstruction" (the input itself, MSE) or "language" (next tokens)
    # or "segmentation" (a class map (batch, classes, H, W) against masks (batch, H, W)).
    task: ClassVar[Literal["classification", "reconstruction", "language", "segmentation"]] = "classification"
    # The inputs the model takes, checked against the data before it is built (models.check_fits):
    # "features" (float, any shape), "images" (float channels x height x width), "tokens" (int64
    # ids), or None: the model's build checks for itself.
    inputs: ClassVar[Literal["features", "images", "tokens", None]] = None

    def factory(self):
        """What builds this model: called as ``factory(spec, **self.factory_kwargs())`` (without
        ``spec`` where ``calls_with_spec`` is false)."""

        return MODELS[self.name][1]

    def factory_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in type(self).model_fields if k != "name"}

    def flops_per_token(self, model, seq_len: int) -> int | None:
        """Training FLOPs per token by the formula the field reports this model's MFU with, or None:
        counted by running the model (``suite.models.flops``). ``model``: built on the meta device."""
        return None

    def calls_with_spec(self) -> bool:
        """Whether the factory takes the data's spec first (every built-in); a custom target may be
        a library's constructor instead, called with the keyword arguments alone (``models/custom.py``)."""
        return True


def input_vocab(spec, vocab: int | None, model: str) -> int:
    """Embedding rows for the data's token ids: the recipe's ``model.vocab`` or the data's."""
    rows = vocab or spec.input_vocab
    if rows is None:
        raise SuiteError(f"model.name={model} needs the size of the vocabulary, which data.name={spec.name} does "
                         f"not give; set model.vocab, or return a DataSpec with input_vocab")
    if spec.input_vocab and rows < spec.input_vocab:
        raise SuiteError(f"model.vocab={vocab} must be at least the data's input vocabulary ({spec.input_vocab}); "
                         f"leave it unset to take the data's")
    return rows
