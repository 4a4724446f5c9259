"""What each rank that mpirun starts runs (``launch.executor: mpi``, ``suite.submit.mpi``):

    mpirun -np N python -m suite.tasks.mpi SPEC.json

It trains its rank of the run the spec names, as a submitit task would (``train_task.train_point``),
with its output in the task log files of a job whose id is mpirun's pid (its parent), and leaves
its outcome in the task's result file. Rank, world size and local rank come from the MPI
environment (``suite.train.dist.adopt_mpi_environment``); MASTER_ADDR/PORT from the spec.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path

from suite.compat import submitit as submitit_compat
from suite.tasks import train as train_task


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    from suite.train import dist

    dist.adopt_mpi_environment()
    rank = int(os.environ["RANK"])
    paths = submitit_compat.task_paths(spec["folder"], str(os.getppid()), rank)  # mpirun's pid: the job id
    for fd, path in ((1, paths.stdout), (2, paths.stderr)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.environ.update(MASTER_ADDR=spec["master_addr"], MASTER_PORT=str(spec["master_port"]))
    # mpirun ends the other ranks with SIGTERM when one dies; say so in this rank's result, so
    # that the follower names the rank that died first, not one mpirun stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: _ended_by_mpirun(paths))
    try:
        ended = train_task.train_point(spec["recipe"], spec["run_dir"], spec["watcher_pid"])
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - the rank's error is recorded in the run folder too
        traceback.print_exc()
        submitit_compat.write_result(paths, "error", traceback.format_exc())
        return 1
    submitit_compat.write_result(paths, "success", rank if ended == "completed" else None)
    return 0


def _ended_by_mpirun(paths) -> None:
    submitit_compat.write_result(paths, "error", "stopped by mpirun after another rank ended")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
