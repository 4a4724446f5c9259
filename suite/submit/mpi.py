"""``launch.executor: mpi``: the ranks of a run are MPI ranks, started on this machine by
``mpirun -np N`` (Open MPI). The job this returns stands in for a submitit local job, so that the
follower (``suite.submit.follow``), the run record and ``suite.status`` treat it as any local run:

- ``job_id`` is mpirun's process id, and the ranks are its children: Ctrl-C is forwarded to them
  (they agree on a step, save a checkpoint and end), a kill ends them and mpirun.
- each rank (``suite/tasks/mpi.py``) writes its output and its outcome to the files a
  submitit task would (``<job>_<rank>_log.out/.err``, ``_result.pkl``), so a rank that died
  without a word is told from one that failed, as for local ranks.
- mpirun runs in its own session: a Ctrl-C in the terminal reaches ``suite.submit`` only, which
  stops the ranks gracefully; mpirun itself would kill them.
- a rank that dies makes mpirun end the others (its default), so the job ends without a hang.

The rendezvous for torch.distributed (gloo) comes from here: MASTER_ADDR/PORT in the environment
mpirun passes on. mpirun's own messages go to ``mpirun.log`` in the job's folder.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from suite.compat import submitit as submitit_compat
from suite.common.errors import INSTALL_MPI4PY, INSTALL_MPIRUN, SuiteError


def mpirun_path() -> str:
    """mpirun's path, or a one-line SuiteError naming the install command."""
    path = shutil.which("mpirun")
    if path is None:
        raise SuiteError(f"launch.executor=mpi starts the ranks with mpirun, which is not on PATH; "
                         f"install Open MPI: {INSTALL_MPIRUN}")
    return path


def check_mpi4py(key: str) -> None:
    """mpi4py importable (found, not imported: importing it initialises MPI in this process)."""
    if importlib.util.find_spec("mpi4py") is None:
        raise SuiteError(f"{key} exchanges through MPI with mpi4py, which is not installed; {INSTALL_MPI4PY}")


def check_srun_pmix() -> None:
    """launch.mpi on Slurm: srun must offer the PMIx plugin. Debian's Open MPI 4.1 is built with
    PMIx only (no Slurm PMI-1/2 client): under ``srun --mpi=pmi2`` or ``--mpi=none`` MPI_Init
    aborts ("OMPI was not built with SLURM's PMI support"); ``--mpi=pmix`` gives one world
    (tested on Debian's Slurm 22.05, slurm/README.md)."""
    try:
        listed = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=30)
        offered = (listed.stdout + listed.stderr).split()
    except (OSError, subprocess.TimeoutExpired):
        offered = []
    if "pmix" not in offered:
        raise SuiteError("launch.mpi=true starts the tasks as MPI ranks with srun --mpi=pmix, but this Slurm "
                         "offers no pmix plugin (srun --mpi=list); install it (Debian: slurm-wlm-basic-plugins "
                         "with libpmix2), or use launch.mpi=false with strategy.transport=torch")


def command(world_size: int, spec: Path, out_dir: Path) -> list[str]:
    """The mpirun command line for ``world_size`` local ranks of the run ``spec`` describes."""
    cmd = [mpirun_path(), "-np", str(world_size),
           "--oversubscribe",  # more ranks than cores is a warning here, as for local ranks
           "--bind-to", "none",  # threads as for local ranks: launch.cpus_per_task or cores / ranks
           "--output-filename", str(out_dir)]  # mpirun's copy; each rank also writes its task logs
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + [sys.executable, "-m", "suite.tasks.mpi", str(spec)]


class MpiJob:
    """A run's mpirun, looking like a submitit local job to the follower."""

    local = True

    def __init__(self, folder: Path, world_size: int, spec: Path, timeout_min: int, signal_delay_s: int):
        self.folder, self.num_tasks = Path(folder), world_size
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        # The ranks import the suite this process runs (a checkout, not another installed copy).
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        with open(self.folder / "mpirun.log", "ab") as log:
            self.proc = subprocess.Popen(command(world_size, spec, self.folder / "mpirun-output"), env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.job_id = str(self.proc.pid)
        self.paths = SimpleNamespace(folder=self.folder)
        self._usr2_at = time.time() + max(0, timeout_min * 60 - signal_delay_s)
        self._kill_at = time.time() + timeout_min * 60
        self._warned, self._settled = False, False

    def task(self, rank: int):
        return SimpleNamespace(paths=submitit_compat.task_paths(self.folder, self.job_id, rank))

    @property
    def state(self) -> str:
        """RUNNING or FINISHED, as submitit says of a local job; at the time limit the ranks get
        SIGUSR2 (checkpoint and stop, as submitit's local executor does) and, later, are killed."""
        if self.proc.poll() is not None:
            if not self._settled:
                self._settled = True
                self._speak_for_stopped_ranks()
            return "FINISHED"
        now = time.time()
        if now >= self._usr2_at and not self._warned:
            self._warned = True
            self._signal_ranks(signal.SIGUSR2)
        if now >= self._kill_at:
            self.cancel()
        return "RUNNING"

    def _signal_ranks(self, signum) -> None:
        import psutil

        try:
            ranks = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for proc in ranks:
            try:
                proc.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    def cancel(self, check: bool = False) -> None:
        self._signal_ranks(signal.SIGKILL)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def death_signal(self, rank: int) -> str | None:
        """The signal mpirun saw end ``rank`` ("SIGKILL"), or None (the follower names the cause)."""
        killed = _killed_rank(self.folder / "mpirun.log")
        found = re.match(r"exited on signal (\d+)", killed[1]) if killed and killed[0] == rank else None
        if not found:
            return None
        try:
            return signal.Signals(int(found.group(1))).name
        except ValueError:
            return f"signal {found.group(1)}"

    def _speak_for_stopped_ranks(self) -> None:
        """When a rank dies, mpirun ends the others, often by SIGKILL, in a collective where no
        Python handler runs: they leave no result and would look killed too. mpirun's log names
        the rank that died (``process rank K ... exited on signal S``); every other rank without
        a result gets one saying mpirun stopped it, so the follower names rank K as the cause."""
        killed = _killed_rank(self.folder / "mpirun.log")
        if killed is None:
            if self.proc.returncode and not any(submitit_compat.left_result(self.task(k)) for k in range(self.num_tasks)):
                # mpirun failed before any rank could say anything (bad option, no slots): its words
                submitit_compat.write_result(self.task(0).paths, "error", f"mpirun exited with code "
                                             f"{self.proc.returncode}: {_last_words(self.folder / 'mpirun.log')}")
            return
        rank, why = killed
        for k in range(self.num_tasks):
            paths = self.task(k).paths
            if k != rank and not submitit_compat.left_result(self.task(k)):
                submitit_compat.write_result(paths, "error", f"stopped by mpirun after rank {rank} {why}")


def _last_words(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()]
    except OSError:
        return "(no mpirun.log)"
    lines = [ln for ln in lines if ln and not set(ln) <= set("-")]
    return " ".join(lines[:3])[:300] or "(nothing in mpirun.log)"


def _killed_rank(log: Path):
    """(rank, "exited on signal 9 (Killed)") from mpirun's log, or None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"process rank (\d+) with PID \d+ on node \S+ (exited on signal \d+(?: \([^)]*\))?)", text)
    return (int(found.group(1)), found.group(2)) if found else None


def submit(recipe, run_dir: Path, watcher_pid: int | None, master_port: int) -> MpiJob:
    """Start the run's ranks under mpirun; its files go to ``<run_dir>/submitit`` as a local job's."""
    folder = Path(run_dir) / "submitit"
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / f"mpi-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
    spec.write_text(json.dumps({"recipe": recipe.model_dump(mode="json"), "run_dir": str(run_dir),
                                "master_addr": "127.0.0.1", "master_port": master_port,
                                "watcher_pid": watcher_pid, "folder": str(folder)}))
    launch = recipe.launch
    return MpiJob(folder, recipe.world_size, spec, launch.timeout_min, launch.signal_delay_s)
