"""Parallel degrees, validated in one place: they must multiply to the world size.

A strategy that splits the world in more than one way (data x pipeline, data x tensor, ...)
declares its degrees here; the error says which degree is off and what would fit.
"""
from __future__ import annotations

import math

from suite.errors import SuiteError


def resolve(strategy: str, world_size: int, degrees: dict[str, int | None]) -> dict[str, int]:
    """Fill at most one degree left as None (or -1) from the world size; check the product.

    ``degrees`` maps recipe keys (e.g. ``strategy.dp``) to their values, in mesh order.
    """
    unknown = [k for k, v in degrees.items() if v in (None, -1)]
    if len(unknown) > 1:
        raise SuiteError(f"strategy {strategy}: at most one of {', '.join(unknown)} may be left to fill from "
                         f"the world size; set the others")
    for key, value in degrees.items():
        if value not in (None, -1) and value < 1:
            raise SuiteError(f"{key}={value} must be a positive degree")
    known = math.prod(v for v in degrees.values() if v not in (None, -1))
    if unknown:
        if world_size % known:
            raise SuiteError(_mismatch(strategy, world_size, degrees, f"{unknown[0]} cannot fill the rest"))
        degrees = {**degrees, unknown[0]: world_size // known}
    elif known != world_size:
        raise SuiteError(_mismatch(strategy, world_size, degrees, "their product must equal the world size"))
    return dict(degrees)


def _mismatch(strategy, world_size, degrees, why) -> str:
    shown = " x ".join(f"{k}={'?' if v in (None, -1) else v}" for k, v in degrees.items())
    fits = [f"{k}={world_size // math.prod(w for j, w in degrees.items() if j != k and w not in (None, -1))}"
            for k, v in degrees.items()
            if world_size % max(1, math.prod(w for j, w in degrees.items() if j != k and w not in (None, -1))) == 0]
    hint = f"; e.g. {' or '.join(fits)}" if fits else ""
    return (f"strategy {strategy}: {shown} does not fit world size {world_size} "
            f"(launch.nodes x launch.tasks_per_node): {why}{hint}")


def device_mesh(ctx, degrees: dict[str, int]):
    """A DeviceMesh over all ranks with one named dimension per degree (names: keys' last part)."""
    from torch.distributed.device_mesh import init_device_mesh

    names = tuple(k.split(".")[-1] for k in degrees)
    return init_device_mesh(ctx.device.type, tuple(degrees.values()), mesh_dim_names=names)
