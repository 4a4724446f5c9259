"""Strategy registry: recipe ``strategy.name`` -> module.

A strategy is one module here with
- ``Options``: a pydantic model (subclass of ``StrategyOptions``) whose ``name`` is a Literal,
  holding the strategy's own recipe keys; it declares its mesh axes to the layout (``mesh_axes``,
  ``pipeline_chunks``; ``suite.strategies.layout``), checks the layout and the model (``check(layout, model)``),
  and predicts the bytes a rank holds (``held_fraction``); as class-level declarations, the
  modules a local pool's ranks may import early (``warm_imports``) and whether a rank may train
  a sweep's next point in the same process after it (``reusable_process``, off by default); and
  the planner's rules (``suite.strategies.costs``): its collectives per step (``comm_rule``), how
  they overlap compute (``overlap``), whether its real code runs on fake tensors (``cannot_fake``)
  and the variants worth trying (``search_space``), each required: the planner refuses a strategy
  that leaves one undeclared;
- ``build(options, setup) -> Engine``, calling ``setup.prepare(module)`` before it wraps the model;
  or, for a strategy that brings its own training loop (``Options.owns_training``, TensorFlow's),
  ``train(options, recipe, ctx, train_set, val_set, log)`` returning what the summary needs.
Heavy libraries (deepspeed, fairscale) are imported inside ``build`` so that reading a recipe
stays fast. Adding a strategy is one module plus one line in ``_MODULES``.
"""
from __future__ import annotations

import importlib

_MODULES = ["single", "ddp", "allreduce", "fsdp", "fsdp1", "tensor", "layer_split", "pipeline", "pipedream_2bw", "fairscale_oss", "fairscale_pipe", "fairscale_fsdp", "zero", "ds_pipeline",
            "hogwild", "param_server", "tf_single", "tf_mirrored", "tf_mirrored_loop", "tf_multiworker", "horovod"]
STRATEGIES = {}
for _m in _MODULES:
    _mod = importlib.import_module(f"suite.strategies.{_m}")
    STRATEGIES[_mod.Options.model_fields["name"].default] = _mod


def build(options, setup):
    engine = STRATEGIES[options.name].build(options, setup)
    # What a checkpoint records of the engine (suite.train.checkpoint): its strategy, and whether
    # its state is saved strategy-neutral, as the options declare.
    engine.strategy, engine.no_neutral_checkpoint = options.name, options.no_neutral_checkpoint
    return engine


def import_early(names) -> list[str]:
    """Import the ``warm_imports`` of the strategies named (unknown names ignored), sorted; a module
    that fails to import is skipped: the strategy's own build fails the same way and says why. The
    modules imported."""
    modules = sorted({m for name in names if name in STRATEGIES for m in STRATEGIES[name].Options.warm_imports})
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    return modules
