"""Commands that print a table (``suite.plan``, ``suite.advise``) keep library noise off it: no
Python warnings and no library log lines up to ERROR (DeepSpeed's accelerator notice, torch's log
of a fake run that falls back to its analytic rule) unless the user asks with ``--verbose``; the
command says what failed in its own words."""
from __future__ import annotations

import logging
import warnings


def quiet_libraries() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.ERROR)
