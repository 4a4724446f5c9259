"""One training step of the recipe's model on a batch without values, before anything launches.

A model can build and still fail its first step: an output the task cannot score (a Hugging Face
output object, a tuple), a forward that does not take the data's inputs, a shape the loss
rejects. Without this trial that is a traceback from every rank after launch; with it, one line
at ``--dry-run`` and before launch (``suite.submit.preflight``). The step runs on the meta
device (shapes only; not on fake tensors: a backward under them starts autograd's device
threads, after which this process could no longer fork ranks). Where the meta device cannot
run it (a forward that reads a value), the trial passes and the rank's real step decides.
"""
from __future__ import annotations

import torch

from suite.common.errors import SuiteError
from suite.models import build as build_model, hf, source
from suite.models.empty import on_meta
from suite.models.task import Task

_BATCH = 2  # samples of the trial batch: more than one, so a squeeze of the batch shows


def check_step(options, spec) -> None:
    """SuiteError naming the failure when forward, loss or backward of the model fails on a batch
    of the data's shape without values."""
    failure = _trial(options, spec)
    if failure is None or isinstance(failure, SuiteError):
        if failure is not None:
            raise failure
        return
    message = " ".join(str(failure).split())[:200]
    raise SuiteError(f"{source(options)} fails a training step on a batch of data.name={spec.name}'s shape "
                     f"({type(failure).__name__}: {message}); it must return what model.task={options.task} "
                     f"scores (docs/plugins.md): fix the model or model.task")


def _trial(options, spec) -> Exception | None:
    """The step's failure, or None where it ran (or where the meta device cannot run it)."""
    try:
        with torch.random.fork_rng(devices=[]):
            _step(on_meta(lambda: build_model(options, spec)), options, spec)
        return None
    except (NotImplementedError, RuntimeError) as e:
        return None if "meta" in str(e) else e
    except Exception as e:  # noqa: BLE001 - whatever the model raises is the answer
        return e


def _step(model, options, spec) -> None:
    dtype = getattr(torch, spec.input_dtype)
    with torch.device("meta"):
        inputs = torch.zeros(_BATCH, *spec.input_shape, dtype=dtype)
        targets = _targets(options.task, spec)
        task = Task(options.task, spec.num_classes)
        if getattr(options, "loss", "task") == "model":
            task.use_model_loss(*hf.loss_function(model))
        output = model(inputs)
        loss = task.loss(output, inputs, targets)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError(f"the loss is {type(loss).__name__} of shape {tuple(getattr(loss, 'shape', ()))}, not a scalar")
        loss.backward()


def _targets(kind: str, spec) -> torch.Tensor:
    if kind == "language":  # the next token at each position: (samples, length), whatever the inputs stack
        return torch.zeros(_BATCH, spec.input_shape[-1], dtype=torch.int64)
    if kind == "segmentation":
        return torch.zeros(_BATCH, *spec.input_shape[1:], dtype=torch.int64)
    return torch.zeros(_BATCH, dtype=torch.int64)
