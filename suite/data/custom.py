"""``data: {name: custom, target: "mypkg.data:load", kwargs: {...}}``: a data set loaded by the
user's factory, found by import path (``suite.factories``).

The factory is called as ``factory(**kwargs)``, like every built-in's ``load``, and returns
(train, val) or (train, val, DataSpec) (``docs/plugins.md``). Its spec and sizes come from what
it returns, so the submitter calls it once before launch (cached on these options); each rank
calls it again to train."""
from typing import ClassVar, Literal

from pydantic import PrivateAttr

from suite.data import DataSpec
from suite.data.base import DataOptions
from suite.factories import TargetOptions


class Custom(TargetOptions, DataOptions):
    name: Literal["custom"] = "custom"
    section: ClassVar = "data"
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


OPTIONS = [Custom]
