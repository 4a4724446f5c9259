"""MPI inside a rank: mpi4py's COMM_WORLD, for what exchanges through MPI rather than through
torch.distributed (``strategy.transport: mpi``; a bare ``mpirun python -m suite.train``'s
rendezvous). Importing mpi4py initialises MPI, so it is imported here, on first use, only."""
from __future__ import annotations

import atexit
import os

from suite.common.errors import INSTALL_MPI4PY, SuiteError

# What says an MPI launcher started this process (the variables suite.train.dist reads).
_MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def started_by_mpi() -> bool:
    return any(v in os.environ for v in _MPI_RANK_VARIABLES)


def comm(key: str = "MPI"):
    """COMM_WORLD; a one-line SuiteError when mpi4py is missing or no MPI launcher started us."""
    if not started_by_mpi():
        raise SuiteError(f"{key} needs ranks an MPI launcher started, but this rank was not (no "
                         f"{' / '.join(_MPI_RANK_VARIABLES)}); launch with launch.executor=mpi")
    try:
        from mpi4py import MPI  # optional: mpi4py is imported only where it is used
    except ImportError:
        raise SuiteError(f"{key} exchanges through MPI with mpi4py, which is not installed; {INSTALL_MPI4PY}") from None
    # mpi4py finalises MPI in the interpreter's teardown, which a command ending through
    # suite.common.exit (os._exit after the atexit handlers) skips: finalise in an atexit handler
    # instead, or the launcher reports a rank that ended without MPI_Finalize as failed.
    atexit.unregister(_finalize)  # once, however many times comm() is asked
    atexit.register(_finalize, MPI)
    return MPI.COMM_WORLD


def _finalize(MPI) -> None:
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


def world(key: str, rank: int, world_size: int):
    """COMM_WORLD, checked to be the same ranks as torch.distributed's world."""
    c = comm(key)
    if (c.Get_rank(), c.Get_size()) != (rank, world_size):
        raise SuiteError(f"{key}: MPI's world (rank {c.Get_rank()} of {c.Get_size()}) is not torch.distributed's "
                         f"(rank {rank} of {world_size}); start every rank with one mpirun (launch.executor=mpi)")
    return c
