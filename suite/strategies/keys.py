"""Recipe keys outside ``strategy.*`` that a strategy cannot honour, refused before launch.

Every training and optimizer key (``training.grad_clip_norm``, ``precision``, ``max_steps``,
``grad_accumulation``, ``optimizer.schedule``, ...) is either honoured by every strategy or
refused when the recipe is validated, so that ``suite.submit --dry-run`` exits 2 naming it; a
key a strategy silently ignored would make its run look comparable when it is not. The PyTorch
strategies honour them through what they share (``Setup``, ``ModuleEngine`` and the loop); a
strategy that cannot honour a key says so in its options class (``StrategyOptions.refuses``, a
tuple of ``Refused``), and ``check`` refuses it here, in one place (``suite.recipe.check``).
``training.precision=fp64`` has its own declaration (``StrategyOptions.no_fp64``).
``tests/strategies/test_strategy_keys.py`` walks every strategy and every such key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from suite.common.errors import SuiteError


@dataclass(frozen=True)
class Refused:
    """One key a strategy cannot honour: refused unless the recipe leaves it at a value in ``allowed``."""
    key: str  # dotted recipe path, as the error names it (training.max_steps)
    allowed: tuple  # the values the strategy does honour; the first is what the error suggests
    why: str  # the reason, said in the error
    read: Optional[Callable[[Any], Any]] = None  # recipe -> the value compared; default: the key's value
    when: Optional[Callable[[Any], bool]] = None  # recipe -> whether the refusal applies at all

    def value(self, recipe):
        if self.read is not None:
            return self.read(recipe)
        value = recipe
        for part in self.key.split("."):
            value = getattr(value, part)
        return value


def check(recipe) -> None:
    """SuiteError (one line: strategy, key, value, why, fix) for the first key the recipe sets
    that its strategy declares it cannot honour."""
    strategy = recipe.strategy
    for refused in type(strategy).refuses:
        if refused.when is not None and not refused.when(recipe):
            continue
        value = refused.value(recipe)
        if value in refused.allowed:
            continue
        default = refused.allowed[0]
        fix = "leave it out" if default is None or default == {} else f"set {refused.key}={_shown(default)}"
        raise SuiteError(f"strategy.name={strategy.name} does not support {refused.key}={_shown(value)}: "
                         f"{refused.why}; {fix}, or use a strategy that does")


def _shown(value) -> str:
    return "true" if value is True else "false" if value is False else str(value)
