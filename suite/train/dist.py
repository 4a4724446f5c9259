"""Rank, world, device and backend: the one place that chooses CUDA+NCCL or CPU+gloo.

The environment comes from whoever started the rank: submitit (``suite.submit.launch`` exports
MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK from the job), torchrun, an MPI launcher (mpirun or
``srun --mpi``: ``adopt_mpi_environment`` reads its variables), or nothing at all (a single
process, world size 1).
"""
from __future__ import annotations

import gc
import os
import socket
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from suite.common import heap, network
from suite.common.errors import SuiteError
from suite.common.ports import free_port
from suite.common.threads import rank_threads
from suite.strategies.context import DistContext


# Rank, world size, local rank and local world size as MPI launchers name them: Open MPI's mpirun,
# then PMIx (Open MPI under srun --mpi=pmix) and PMI-1/2 (MPICH's and Intel MPI's hydra, srun
# --mpi=pmi2). PMIx gives no size variable; PMIX_SIZE is not standard, so srun's SLURM_* fill in.
_MPI_VARIABLES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def adopt_mpi_environment() -> bool:
    """Where an MPI launcher started this rank and nothing set torch's variables: export RANK,
    WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE from the launcher's (the one place that reads
    them). True when they came from MPI. MASTER_ADDR/PORT are the launching side's to give."""
    if "WORLD_SIZE" in os.environ:
        return False
    for rank, size, local_rank, local_size in _MPI_VARIABLES:
        if rank in os.environ and size in os.environ:
            world = os.environ[size].split("(")[0]  # SLURM_NTASKS_PER_NODE may read "2(x3)"
            os.environ.update(RANK=os.environ[rank], WORLD_SIZE=world,
                              LOCAL_RANK=os.environ.get(local_rank, os.environ[rank]),
                              LOCAL_WORLD_SIZE=os.environ.get(local_size, world).split("(")[0])
            return True
    return False


def _agree_rendezvous_through_mpi() -> None:
    """A bare ``mpirun python -m suite.train``: rank 0's host and a free port of it, told to
    every rank by MPI (suite.submit's mpi executor gives MASTER_ADDR/PORT itself)."""
    from suite.common import mpi

    here = (socket.gethostname(), free_port()) if os.environ["RANK"] == "0" else None
    host, port = mpi.comm().bcast(here, root=0)
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port))


def uses_cuda(device: str) -> bool:
    """launch.device as this process resolves it: "auto" is CUDA where torch sees a GPU."""
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


# The interface this process's last ``init`` chose (``suite.common.network.choose_interface``'s
# answer; None before, or for one rank): the rank records it in ranks/rank<N>.json.
chosen_network: dict | None = None


def choose_network(interface: str | None = None) -> dict:
    """Export GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME as the interface the route to MASTER_ADDR
    leaves by, or ``interface`` (launch.interface); one that does not exist or cannot reach the
    master is a SuiteError before any process group forms. A variable the environment already sets
    wins over the route (not over launch.interface)."""
    global chosen_network
    chosen = network.choose_interface(os.environ["MASTER_ADDR"], interface)
    if chosen["interface"] is not None:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if interface is not None or not os.environ.get(var):
                os.environ[var] = chosen["interface"]
            elif os.environ[var] != chosen["interface"]:
                chosen["why"] += f" ({var}={os.environ[var]} from the environment kept)"
    chosen_network = chosen
    return chosen


def init(device: str = "auto", devices_per_task: int = 1, cpus_per_task=None,
         collective_timeout_s: int = 300, interface: str | None = None) -> DistContext:
    """Join (or create) the process group and pick this rank's device(s), thread count and network
    interface (``choose_network``; launch.interface when given)."""
    adopt_mpi_environment()
    if not {"MASTER_ADDR", "MASTER_PORT"} <= set(os.environ) and "WORLD_SIZE" in os.environ:
        from suite.common import mpi

        if mpi.started_by_mpi():
            _agree_rendezvous_through_mpi()
    if "WORLD_SIZE" not in os.environ:  # a plain `python -m suite.train`: one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))

    if uses_cuda(device):
        have = torch.cuda.device_count()
        first = local_rank * devices_per_task
        if first + devices_per_task > have:
            raise SuiteError(f"rank {rank} needs GPUs {first}..{first + devices_per_task - 1} but this node "
                             f"has {have}; lower launch.tasks_per_node or launch.devices_per_task")
        devices = tuple(torch.device("cuda", first + i) for i in range(devices_per_task))
        torch.cuda.set_device(devices[0])
        backend = "nccl"
    else:
        # Several "devices" of one CPU process are the same device; the split stays real in code.
        devices = tuple(torch.device("cpu") for _ in range(devices_per_task))
        backend = "gloo"
        heap.keep_freed_memory()  # a step's buffers are not page-faulted back in every step (common/heap.py)
    threads = rank_threads(len(os.sched_getaffinity(0)), local_world, cpus_per_task)
    torch.set_num_threads(threads)
    if not dist.is_initialized():
        if world > 1 or interface is not None:
            choose_network(interface)
        timeout = timedelta(seconds=collective_timeout_s)
        # CUDA: the group bound to this rank's GPU, as torchtitan makes it: NCCL's communicator
        # is created now (eagerly), on the right device, not at the first collective
        bound = {"device_id": devices[0]} if backend == "nccl" else {}
        announce = os.environ.get("SCALESUITE_RENDEZVOUS")
        if announce and world > 1:  # suite.submit's ranks: ports outside the ephemeral range, bounded waits
            store = _rendezvous(Path(announce), rank, world, collective_timeout_s)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout, **bound)
            if rank == 0:  # every rank has read it by now: the group formed through the store
                Path(announce).unlink(missing_ok=True)
        else:  # torchrun, mpirun and the like gave MASTER_ADDR/PORT themselves
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **bound)
    return DistContext(rank, world, local_rank, local_world, devices[0], backend, devices)


def _rendezvous(announce: Path, rank: int, world: int, collective_timeout_s: int):
    """Rank 0 listens on a candidate port and announces it; the others connect to that one."""
    from suite.train import rendezvous

    host, wait_s = os.environ["MASTER_ADDR"], min(rendezvous.TIMEOUT_S, collective_timeout_s)
    if rank == 0:
        store, port = rendezvous.serve(announce, host, world, collective_timeout_s)
    else:
        store, port = rendezvous.join(announce, rank, host, world, wait_s)
        store.set_timeout(timedelta(seconds=collective_timeout_s))
    os.environ["MASTER_PORT"] = str(port)  # for anything that reads it later
    return store


def nccl_settings(backend: str) -> dict:
    """What NCCL ran with on this rank: its version and every NCCL_* variable set (interfaces,
    protocols, algorithms, debug), for the run record; {} off NCCL."""
    if backend != "nccl":
        return {}
    return {"version": ".".join(map(str, torch.cuda.nccl.version())),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}}


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    # Free now what still holds a process group or tensors in reference cycles (a DDP reducer and
    # its module, a strategy's groups): otherwise they go at interpreter exit, where a gloo worker
    # thread that drops a Python-owned tensor cannot take the GIL and the rank aborts (SIGABRT,
    # "terminate called without an active exception") after training completed. Seen once in a
    # full test run on a 2-node Slurm MPI run.
    gc.collect()
