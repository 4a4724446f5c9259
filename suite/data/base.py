"""What every data set's recipe options share, and the one way data is loaded: the factory called
with the options' keyword arguments, its result checked (contract: ``suite/data/__init__.py``)."""
import importlib
from typing import ClassVar, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt, PrivateAttr
from torch.utils.data import DataLoader, TensorDataset

from suite.data import DataSpec
from suite.common.errors import SuiteError

_LIMITS = ("name", "limit_train", "limit_val")  # applied by the suite, not passed to the factory


class DataOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # What a sample's target is: "labels" (a class id, or next tokens) or "masks" (a class id per
    # pixel, H x W: segmentation); checked against the model's task before launch.
    targets: ClassVar[Literal["labels", "masks"]] = "labels"
    limit_train: Optional[PositiveInt] = None  # use only the first N training samples
    limit_val: Optional[PositiveInt] = None

    def target_kind(self) -> str:
        """``targets``; a data set known only from its tensors (custom) tells from their shapes."""
        return self.targets

    def factory(self):
        """What loads this data set: called as ``factory(**self.factory_kwargs())``; a built-in's is
        its module's ``load``."""
        return importlib.import_module(type(self).__module__).load

    def factory_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in type(self).model_fields if k not in _LIMITS}

    def spec(self) -> DataSpec:
        """What the model needs to know; built-ins know it without loading, others take it from the data."""
        return self.loaded()[2]

    def loaded(self) -> tuple[TensorDataset, TensorDataset, DataSpec]:
        """The factory's (train, val, spec), checked, before limits."""
        # Same data wherever it is called (submitter or rank), the training RNG not moved, and real
        # CPU tensors even when asked for inside a meta-device block (models built for their shapes).
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            torch.manual_seed(0)
            result = self.factory()(**self.factory_kwargs())
        target = getattr(self, "target", None)
        return checked(result, f"data.target={target}" if target else f"data.name={self.name}", self.name)

    def load(self) -> tuple[TensorDataset, TensorDataset]:
        """(training, validation) datasets of (input, target) tensors, limits applied."""
        train, val, _ = self.loaded()
        return self.limited(train, val)

    def check(self) -> None:
        """Raise SuiteError for options that do not fit together or with the data (recipe time)."""

    def train_loader(self, train, sampler, batch_size: int | None, seed: int) -> DataLoader:
        """This rank's training batches (``sampler`` picks its share); image data sets augment them
        here (``suite.data.images``). ``seed`` is ``training.seed``. ``batch_size`` None: the
        sampler yields each batch's indices itself (training.balance's unequal shares,
        suite.train.balance)."""
        return loader(train, sampler, batch_size)

    def check_available(self) -> None:
        """Raise SuiteError if the data cannot be loaded (checked before launch)."""

    def sizes(self) -> tuple[int, int] | None:
        """(training, validation) samples the data set holds before limits, or None if unknown
        before loading (checked before launch against the batch size and the node's memory)."""
        return None

    def limited(self, train: TensorDataset, val: TensorDataset):
        return _head(train, self.limit_train), _head(val, self.limit_val)


class LoadedOnce(DataOptions):
    """A data set whose spec and sizes are known only from its data: the factory runs once per
    process (the submitter's checks, or a rank) and its result is kept on these options."""
    _loaded = PrivateAttr(default=None)

    def loaded(self):
        if self._loaded is None:
            self._loaded = super().loaded()
        return self._loaded

    def spec(self) -> DataSpec:
        return self.loaded()[2]

    def sizes(self) -> tuple[int, int]:
        train, val, _ = self.loaded()
        return len(train), len(val)

    def target_kind(self) -> str:
        inputs, targets = self.loaded()[0].tensors
        masks = inputs.ndim == 4 and targets.ndim == 3 and targets.shape[1:] == inputs.shape[2:]
        return "masks" if masks else "labels"


def loader(dataset, sampler, batch_size: int | None, **options) -> DataLoader:
    """Batches of ``batch_size`` from ``sampler`` (the last, short one dropped), or, with
    ``batch_size`` None, the batches a batch sampler yields."""
    if batch_size is None:
        return DataLoader(dataset, batch_sampler=sampler, **options)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, **options)


def _head(ds: TensorDataset, n):
    if n is None or n >= len(ds):
        return ds
    return TensorDataset(*(t[:n] for t in ds.tensors))


def checked(result, source: str, name: str) -> tuple[TensorDataset, TensorDataset, DataSpec]:
    """A data factory's result as (train, val, spec); SuiteError naming ``source`` if it is not
    (train, val) or (train, val, DataSpec), each a TensorDataset of (inputs, targets) or such a pair."""
    fix = "return (train, val) or (train, val, DataSpec), each a TensorDataset(inputs, targets)"
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise SuiteError(f"{source} returns {_kind(result)}; {fix}")
    train, val = (_tensors(part, source, which, fix) for part, which in zip(result, ("train", "validation")))
    derived = derive_spec(name, train, val)
    spec = result[2] if len(result) == 3 else derived
    if not isinstance(spec, DataSpec):
        raise SuiteError(f"{source} returns {_kind(spec)} as its third item, not a DataSpec; {fix}")
    if tuple(spec.input_shape) != derived.input_shape or spec.input_dtype != derived.input_dtype:
        raise SuiteError(f"{source} returns a DataSpec of {spec.input_dtype} inputs of shape {list(spec.input_shape)}, "
                         f"but its data has {derived.input_dtype} inputs of shape {list(derived.input_shape)}; "
                         f"make them agree, or return (train, val) and let the suite derive the spec")
    return train, val, spec


def _tensors(part, source: str, which: str, fix: str) -> TensorDataset:
    tensors = part.tensors if isinstance(part, TensorDataset) else part
    if not (isinstance(tensors, (tuple, list)) and len(tensors) == 2
            and all(isinstance(t, torch.Tensor) for t in tensors)):
        raise SuiteError(f"{source} returns {_kind(part)} as its {which} set; {fix}")
    inputs, targets = tensors
    if inputs.dtype not in (torch.float32, torch.int64):
        raise SuiteError(f"{source} returns {which} inputs of dtype {str(inputs.dtype).removeprefix('torch.')}; "
                         f"return float32 inputs (or int64 token ids)")
    if len(inputs) != len(targets) or len(inputs) == 0:
        raise SuiteError(f"{source} returns {len(inputs)} {which} inputs and {len(targets)} targets; "
                         f"return as many of each, at least one")
    return part if isinstance(part, TensorDataset) else TensorDataset(inputs, targets)


def derive_spec(name: str, train: TensorDataset, val: TensorDataset) -> DataSpec:
    """The spec the tensors imply: inputs' shape and dtype, classes = largest integer target + 1
    (0 for float targets), tokens per sample = sequence length for int64 sequences, input
    vocabulary = largest input id + 1 for int64 inputs."""
    inputs = train.tensors[0]
    targets = [ds.tensors[1] for ds in (train, val)]
    integer = not any(t.is_floating_point() or t.is_complex() for t in targets)
    classes = int(max(t.max() for t in targets)) + 1 if integer else 0
    dtype = str(inputs.dtype).removeprefix("torch.")
    tokens = inputs.shape[1] if dtype == "int64" and inputs.ndim == 2 else None
    input_vocab = int(max(ds.tensors[0].max() for ds in (train, val))) + 1 if dtype == "int64" else None
    return DataSpec(name, tuple(inputs.shape[1:]), classes, dtype, tokens, input_vocab)


def _kind(obj) -> str:
    if isinstance(obj, tuple):
        return f"a tuple of {len(obj)}"
    return type(obj).__name__
