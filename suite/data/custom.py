"""``data: {name: custom, target: "mypkg.data:load", kwargs: {...}}``: a data set loaded by the
user's factory, found by import path (``suite.common.factories``).

The factory is called as ``factory(**kwargs)``, like every built-in's ``load``, and returns
(train, val) or (train, val, DataSpec) (``docs/plugins.md``). Its spec and sizes come from what
it returns, so the submitter calls it once before launch (cached on these options); each rank
calls it again to train."""
from typing import ClassVar, Literal

from suite.data.base import LoadedOnce
from suite.common.factories import TargetOptions


class Custom(TargetOptions, LoadedOnce):
    name: Literal["custom"] = "custom"
    section: ClassVar = "data"


OPTIONS = [Custom]
