"""An engine's state_dict holds all it needs: save after a few steps, build a fresh engine, load,
and the next steps' losses equal those of the engine that kept going. Run on forked ranks."""
from __future__ import annotations

import io

import torch

from suite import strategies
from suite.train import dist as sdist, rank as train_rank


def _steps(engine, x, y, n) -> list:
    out = []
    for _ in range(n):
        r = engine.train_step(x, y)
        out.append(r.loss.item() if r.loss is not None else None)
    return out


def continued_and_resumed(recipe, steps: int = 3):
    """(losses of the engine that kept going, losses of a fresh engine loaded from its state)."""
    ctx = sdist.init("cpu")
    try:
        setup = train_rank.make_setup(recipe, ctx)
        data, _ = recipe.data.load()
        n = recipe.layout().rank_batch
        x, y = data.tensors[0][ctx.rank * n:(ctx.rank + 1) * n], data.tensors[1][ctx.rank * n:(ctx.rank + 1) * n]
        if recipe.layout().dp_size == 1:  # ranks of one pipeline read the same batch
            x, y = data.tensors[0][:n], data.tensors[1][:n]
        first = strategies.build(recipe.strategy, setup)
        _steps(first, x, y, steps)
        buffer = io.BytesIO()
        torch.save(first.state_dict(), buffer)
        continued = _steps(first, x, y, steps)
        buffer.seek(0)
        second = strategies.build(recipe.strategy, setup)
        second.load_state_dict(torch.load(buffer, weights_only=False))
        return continued, _steps(second, x, y, steps)
    finally:
        sdist.close()
