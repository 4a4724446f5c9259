"""Small functions for submitit jobs in tests (a light module: each task imports it)."""
import time

import submitit


def rank1_fails_while_rank0_works(seconds: float):
    if submitit.JobEnvironment().global_rank == 1:
        raise ValueError("planted failure on rank 1")
    time.sleep(seconds)
