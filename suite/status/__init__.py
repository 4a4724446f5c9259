"""``python -m suite.status [RUNS ...]``: the state of each run (``__main__``; the states come from
``suite.record.status``)."""
