"""Errors meant for people: one line that names the problem and the fix."""
import sys


# How to install what launch.executor=mpi and strategy.transport=mpi need (said by both sides).
INSTALL_MPIRUN = "apt-get install -y openmpi-bin libopenmpi-dev (or bash tests/install_mpi.sh)"
INSTALL_MPI4PY = 'pip install -e ".[mpi]" (mpi4py; it loads Open MPI\'s library: bash tests/install_mpi.sh)'


class SuiteError(Exception):
    """A user-facing error: bad recipe, impossible world size, missing data, failed run.

    The CLI prints ``error: <message>`` and exits with ``exit_code`` (2 for bad input,
    1 for a run that failed), never a traceback.
    """

    exit_code = 2


class RunFailed(SuiteError):
    """The job started but a rank failed, was cancelled or timed out."""

    exit_code = 1


class RunCancelled(RunFailed):
    """The run was stopped on request (Ctrl-C); what it did is kept and it can be resumed."""

    exit_code = 130


def one_line(command, *args) -> int:
    """Run a command's body; a SuiteError becomes ``error: <message>`` on stderr and its exit code."""
    try:
        return command(*args)
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
