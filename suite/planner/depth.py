"""A deep model's fake run from shallow copies: a model of ``layers`` identical blocks between
an input and an output part costs, in every count the fake run takes (bytes held, the peak,
FLOPs, each collective's bytes and calls, each operator's calls), ``f(1) + (L - 1) (f(2) - f(1))``
at depth L. The fake run of an 8-billion-parameter Llama takes minutes here, its copies at 1, 2
and 3 blocks seconds. The third checks the rule: where the copy at 3 blocks is not what those
at 1 and 2 extrapolate to (the peak moves to another part of the step, a bucket boundary moves),
the caller runs the model at its own depth instead. The caching allocator's reserve beyond the
peak is the one count that is not linear in depth (the cache reuses blocks): it is the deepest
copy's, an estimate.

Only for a model section with ``layers`` (the suite's transformer and Llama) outside a pipeline,
whose stages the depth would cut otherwise."""
from __future__ import annotations

DEPTHS = (1, 2, 3)


class NotLinear(ValueError):
    """The counts do not grow by one block's worth per block."""


def reducible(recipe) -> bool:
    layers = getattr(recipe.model, "layers", None)
    return isinstance(layers, int) and layers > DEPTHS[-1] and recipe.layout().degree("pipeline") == 1


def at_depth(recipe, layers: int):
    """The recipe with ``layers`` blocks, all else as written."""
    from suite import recipe as recipes
    import yaml

    raw = yaml.safe_load(recipes.dump(recipe))
    raw["model"] = {**raw["model"], "layers": layers}
    return recipes.validate(raw)


def extrapolate(shallow: list[dict], layers: int) -> dict:
    """``StepProfile.to_dict()`` at ``layers`` blocks from those at ``DEPTHS`` (``shallow``, in
    that order); NotLinear where the one at the last depth is not what the first two give it."""
    one, two, three = ({k: v for k, v in p.items() if k != "reserved_bytes"} for p in shallow)
    if not _close(_line(one, two, DEPTHS[-1]), _line(three, three, 1)):
        raise NotLinear("the copy at 3 blocks is not what those at 1 and 2 extrapolate to")
    out = _line(one, two, layers)
    if shallow[-1].get("reserved_bytes") is not None:
        # The cache reuses freed blocks, so what it reserves does not grow by a block's worth per
        # block: the deepest copy's reserve beyond its peak, added to the extrapolated peak.
        out["reserved_bytes"] = out["peak_bytes"] + shallow[-1]["reserved_bytes"] - shallow[-1]["peak_bytes"]
    return out


def _line(a, b, layers: int):
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str):
        if a != b:
            raise NotLinear(f"{a!r} and {b!r} differ")
        return a
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        value = a + (layers - 1) * (b - a)
        return int(value) if isinstance(a, int) and isinstance(b, int) else value
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _line(a.get(k, _zero(b.get(k))), b.get(k, _zero(a.get(k))), layers) for k in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list):
        if all(isinstance(row, list) for row in a + b):  # rows of counts: a key, then the count last
            rows_a, rows_b = ({tuple(r[:-1]): r[-1] for r in rows} for rows in (a, b))
            keys = sorted({*rows_a, *rows_b}, key=repr)
            return [[*k, _line(rows_a.get(k, 0), rows_b.get(k, 0), layers)] for k in keys]
        if len(a) != len(b):
            raise NotLinear("lists of different lengths")
        return [_line(x, y, layers) for x, y in zip(a, b)]
    raise NotLinear(f"cannot extrapolate {type(a).__name__} and {type(b).__name__}")


def _close(x, y) -> bool:
    if isinstance(x, float) or isinstance(y, float):
        return isinstance(x, (int, float)) and isinstance(y, (int, float)) and abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1)
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_close(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_close(a, b) for a, b in zip(x, y))
    return x == y


def _zero(value):
    """What a count missing at one depth stands for: none of it."""
    if isinstance(value, dict):
        return {}
    if isinstance(value, list):
        return []
    return 0 if isinstance(value, (int, float)) else value
