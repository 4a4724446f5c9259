"""scalesuite: run, measure and compare distributed-training strategies."""
from suite.common import forking as _forking

_forking.install()  # a forked child of a process that ran on several threads must not hang
