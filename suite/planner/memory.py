"""Predicted bytes per rank before launch: parameters counted on the meta device (no memory),
gradients and optimizer state from the optimizer's state size, split as the strategy says."""
from __future__ import annotations

# Optimizer state tensors per parameter element.
_STATE_PER_PARAM = {"sgd": lambda o: 1 if o.momentum else 0, "adam": lambda o: 2, "adamw": lambda o: 2}


def parameter_count(recipe) -> int:
    return sum(p.numel() for p in recipe.model_info().build_meta().parameters())


def predicted_held_bytes(recipe) -> dict:
    """{"total": {...}, "per_rank": {...}} in bytes of parameters, gradients, optimizer_state."""
    n = parameter_count(recipe)
    # fp32 master weights (bf16 autocast keeps fp32 parameters); fp64 trains in float64
    element = 8 if recipe.training.precision == "fp64" else 4
    states = _STATE_PER_PARAM[recipe.optimizer.name](recipe.optimizer)
    total = {"parameters": n * element, "gradients": n * element, "optimizer_state": n * element * states}
    return {"parameters_count": n, "total": total,
            "per_rank": recipe.strategy.held_fraction(total, recipe.layout())}
