"""A small recipe for the planner's tests: an MLP on synthetic 8x8 images, ``strategy`` on
``nodes`` x ``per_node`` ranks (Slurm past one node), Adam, a global batch of 64."""
from suite import recipe as recipes

RAW = {"name": "t", "model": {"name": "mlp", "hidden": [64, 64]},
       "data": {"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 256, "n_val": 32},
       "strategy": {"name": "ddp"}, "optimizer": {"name": "adam", "lr": 0.001},
       "training": {"epochs": 1, "batch_size": 64, "seed": 0}, "launch": {"tasks_per_node": 2},
       "tracking": {"wandb": "disabled"}}


def small_recipe(strategy: dict, nodes: int, per_node: int, model: dict | None = None, **training):
    return recipes.validate({**RAW, "model": model or RAW["model"], "strategy": strategy,
                             "training": {**RAW["training"], **training},
                             "launch": {"executor": "slurm" if nodes > 1 else "local", "nodes": nodes,
                                        "tasks_per_node": per_node}})
