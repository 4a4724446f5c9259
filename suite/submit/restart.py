"""Automatic restarts (``launch.max_restarts``): when a followed run fails because a rank died
(killed, crashed, its node lost: ``follow.Failure.restartable``), the follower submits it again
into its own folder, as ``python -m suite.submit --resume RUN`` does: the ranks load the last
complete checkpoint (or start over when there is none), the records logged after it are dropped
and redone, so the per-step losses equal an uninterrupted run's. Up to ``max_restarts`` times per
run; bad input (a rank's ``SuiteError``: the recipe, the data, a full disk), a cancel (Ctrl-C,
``scancel``), a Slurm job that can never start and a time limit are never restarted.

On Slurm the new job leaves out the node the failing rank ran on (``sbatch --exclude``), where
it is known (srun's line naming the task, the rank's process record, or the nodes of a NODE_FAIL
job that Slurm now reports down) and only while the run still fits on the partition's other
usable nodes; otherwise the line says why the node is kept.

With ``launch.elastic``, a run that no longer fits (its lost node not back within
``launch.elastic_wait_s``) continues on the nodes left, the same global batch through gradient
accumulation (``suite.submit.elastic``), from its strategy-neutral checkpoint. A restart's job that cannot
start on the nodes usable (``unplaceable``: asked for a node Slurm marked down or drained only
after the restart was decided) is given up after ``elastic_wait_s`` by its follower and restarted
the same way, so no restart pends for a node that does not return.

Each restart is an attempt in the run record with its cause (``run_record.announce_restart``)
and one line here: ``restart 1/3 from checkpoint step 30: rank 1 killed by SIGKILL after step 37``.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from suite.common.errors import RunCancelled, SuiteError
from suite.record import run_record
from suite.record.status import squeue
from suite.submit import elastic

# sinfo's short node states (%t) in which a node takes no new job; a trailing "*" (not
# responding) says the same of any state.
_UNUSABLE = ("down", "drain", "drng", "fail", "failg", "futr", "maint", "unk", "inval", "npc", "boot", "pow_dn")


@dataclass
class Restart:
    """One restart decided: what to submit and what the line says."""
    number: int
    of: int
    cause: str
    from_step: int
    recipe: object  # the run's recipe; on Slurm with the excluded nodes in launch.sbatch_extra
    excluded: list[str] = field(default_factory=list)
    note: str = ""

    def line(self) -> str:
        where = f"from checkpoint step {self.from_step}" if self.from_step else "from the start (no checkpoint yet)"
        return f"restart {self.number}/{self.of} {where}: {self.cause}" + (f"; {self.note}" if self.note else "")


class Restarts:
    """One run's restart budget, kept by the follower (``suite.submit.cli``)."""

    def __init__(self, recipe, run_dir: Path, printer=print):
        self.recipe, self.run_dir, self.printer = recipe, Path(run_dir), printer
        self.limit = recipe.launch.max_restarts
        self.used = 0
        self.excluded = _node_list(recipe.launch.sbatch_extra.get("exclude"))  # the recipe's own, kept
        self.last_cause: str | None = None

    def next(self, watch, error) -> Restart | None:
        """After ``watch``'s run failed with ``error``: the restart to submit (recorded in the run
        record and said in one line), or None when it is not to be restarted."""
        failure = getattr(watch, "failure", None)
        if failure is None or isinstance(error, RunCancelled) or not failure.restartable:
            return None
        self.last_cause = failure.cause
        if self.used >= self.limit:
            return None
        self.used += 1
        saved = run_record.latest_checkpoint(self.run_dir)
        restart = Restart(self.used, self.limit, failure.cause, saved["step"] if saved else 0, self.recipe)
        if self.recipe.launch.executor == "slurm":
            self._exclude(restart, failure, watch.job.job_id)
        fields = {"failed_job_id": str(watch.job.job_id)}
        if restart.excluded:
            fields["excluded_nodes"] = restart.excluded
        run_record.archive_errors(self.run_dir)  # the new attempt is not taken for failed by its follower
        run_record.announce_restart(self.run_dir, restart.number, restart.cause, restart.from_step, **fields)
        self.printer(restart.line(), flush=True)
        return restart

    def gave_up(self, error) -> str:
        """The one-line error of a run that failed for good: ``error``'s, and the restarts spent."""
        if not self.used:
            return str(error)
        return (f"{error}; gave up after {self.used} automatic restart(s) (launch.max_restarts={self.limit}), "
                f"last cause: {self.last_cause}")

    def _exclude(self, restart: Restart, failure, job_id: str) -> None:
        """Leave the failed node out of the next job where the run still fits without it; with
        launch.elastic, where it does not, wait for the node, then continue on fewer nodes."""
        launch = self.recipe.launch
        failed = _failed_nodes(failure, job_id)
        new = [n for n in failed if n and n not in self.excluded]
        if new:
            usable = usable_nodes(launch.partition)
            left = None if usable is None else [n for n in usable if n not in self.excluded + new]
            if left is not None and len(left) < launch.nodes and launch.elastic:
                back = self._wait_for_nodes(launch, new, launch.elastic_wait_s - failure.waited_s)
                if back is not None:  # a lost node that came back is not left out
                    new = [n for n in new if n not in back]
                    left = [n for n in back if n not in new]
            if not new:
                restart.note = "the lost node came back"
            elif left is None:
                restart.note = f"node {','.join(new)} not excluded: sinfo cannot tell which nodes are left"
            elif len(left) < launch.nodes and launch.elastic and self._shrink(restart, len(left)):
                self.excluded += new
                restart.note = f"excluding node {','.join(self.excluded)}; {restart.note}"
            elif len(left) < launch.nodes:
                restart.note = (f"node {','.join(new)} not excluded: the run needs {launch.nodes} node(s) and "
                                f"{len(left)} usable would be left{_in(launch.partition)}")
            else:
                self.excluded += new
                restart.note = f"excluding node {','.join(self.excluded)}"
        elif launch.elastic and self._too_few_nodes(launch):  # no node named, yet too few left to run
            left = self._wait_for_nodes(launch, [], launch.elastic_wait_s - failure.waited_s) or []
            if len(left) < launch.nodes and self._shrink(restart, len(left)):
                restart.note = f"{len(left)} usable node(s) left; {restart.note}"
        elif self.excluded:
            restart.note = f"excluding node {','.join(self.excluded)}"
        restart.excluded = list(self.excluded)
        if self.excluded:
            launch = restart.recipe.launch
            extra = {**launch.sbatch_extra, "exclude": ",".join(self.excluded)}
            restart.recipe = restart.recipe.model_copy(update={"launch": launch.model_copy(update={"sbatch_extra": extra})})
        self.recipe = restart.recipe  # a later restart starts from this one's launch

    def _too_few_nodes(self, launch) -> bool:
        left = self._nodes_left(launch)
        return left is not None and len(left) < launch.nodes

    def _nodes_left(self, launch) -> list[str] | None:
        """The partition's usable nodes not yet excluded; None when sinfo cannot say."""
        usable = usable_nodes(launch.partition)
        return None if usable is None else [n for n in usable if n not in self.excluded]

    def _wait_for_nodes(self, launch, lost: list[str], wait_s: float) -> list[str] | None:
        """Up to ``wait_s`` for enough usable nodes (the lost one back, or others); the nodes left."""
        deadline, left = time.monotonic() + max(0.0, wait_s), None
        if wait_s > 0:
            what = f"node {','.join(lost)} to come back" if lost else f"{launch.nodes} usable node(s)"
            self.printer(f"waiting up to {wait_s:.0f} s (launch.elastic_wait_s) for {what}", flush=True)
        while True:
            left = self._nodes_left(launch)
            if left is not None and len(left) >= launch.nodes or time.monotonic() >= deadline:
                return left
            time.sleep(2)

    def _shrink(self, restart: Restart, nodes_left: int) -> bool:
        """The run on the most nodes left that divide its node count, the same global batch
        through gradient accumulation (``elastic.shrunk``); False, with the reason in the
        restart's note, where it cannot."""
        try:
            restart.recipe, restart.note = elastic.shrunk(self.recipe, nodes_left)
        except SuiteError as e:
            restart.note = f"cannot continue on fewer nodes: {e}"
            return False
        return True


# The reasons Slurm gives a pending job whose nodes are down or drained (squeue's %r: the
# reason, or the description it sets in its place).
NODES_UNAVAILABLE = ("ReqNodeNotAvail", "Nodes required for job are DOWN, DRAINED", "NodeDown")


def unplaceable(job_id: str) -> str | None:
    """Why a pending job cannot start on the nodes usable now, or None where it may: Slurm says its
    nodes are down or drained, or its partition has fewer usable nodes than it asks (whatever
    reason Slurm gives meanwhile: a restart submitted in the moment before Slurm marked a lost
    node pends with "Resources" until it does)."""
    listed = squeue(job_id, "%D|%P|%r")
    if not listed or listed.count("|") < 2:
        return None
    asked, partition, reason = listed.split("|", 2)
    if reason.startswith(NODES_UNAVAILABLE):
        return f"Slurm gives the reason {reason}"
    usable = usable_nodes(partition or None)
    if usable is not None and asked.isdigit() and len(usable) < int(asked):
        return f"it asks {asked} node(s) and {len(usable)} usable are left{_in(partition or None)} (Slurm: {reason})"
    return None


def _failed_nodes(failure, job_id: str) -> list[str]:
    """The nodes to leave out. Those of the job's nodes (as squeue listed them while it ran, else
    as sacct knows them) that Slurm now reports unusable come first: a lost node explains the
    failure better than the error of a rank on a live node whose peer went with it (rank 0's
    collective fails when rank 1's node dies). Else the failing rank's node."""
    listed = failure.job_nodes or (failure.node if failure.node and any(c in failure.node for c in "[,") else "")
    lost = _unusable_of(listed) if listed else _lost_nodes(job_id)
    if lost:
        return lost
    if failure.node and not any(c in failure.node for c in "[,"):
        return [failure.node]
    return _lost_nodes(job_id) if listed else []


SINFO_PATIENCE_S = 10.0  # how long a restart waits for sinfo to say which nodes are lost


def _unusable_of(node_list: str) -> list[str]:
    """The nodes of a Slurm node list ("n[1-2]") that sinfo now reports unusable. One sinfo call
    for those nodes, asked again each second for up to ``SINFO_PATIENCE_S`` while it fails: right
    after a node is lost, a busy controller may not answer for a while (without asking again, a
    lost node went unseen and the restart blamed the live node of the rank it had been talking to)."""
    deadline = time.monotonic() + SINFO_PATIENCE_S
    while (states := _node_states(nodes=node_list)) is None and time.monotonic() < deadline:
        time.sleep(1.0)
    return [] if states is None else [n for n, usable in states.items() if not usable]


def _in(partition) -> str:
    return f" in partition {partition}" if partition else " in the default partition"


def _node_list(value) -> list[str]:
    return [n for n in str(value).split(",") if n] if value else []


def _run(*cmd: str) -> str | None:
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def usable_nodes(partition: str | None) -> list[str] | None:
    """Nodes of ``partition`` (default: the cluster's default partition) that take jobs now, by
    sinfo; None when sinfo cannot say."""
    if partition is None:
        listed = _run("sinfo", "-h", "-o", "%P")
        defaults = [p.rstrip("*") for p in (listed or "").split() if p.endswith("*")]
        partition = defaults[0] if defaults else None
    states = _node_states(partition)
    return None if states is None else sorted(n for n, usable in states.items() if usable)


def _node_states(partition: str | None = None, nodes: str | None = None) -> dict[str, bool] | None:
    """node -> whether it takes jobs now (sinfo's state), of one partition or all, or of the nodes
    of a Slurm node list."""
    out = _run("sinfo", "-h", "-N", "-o", "%N %t", *(["-p", partition] if partition else []),
               *(["-n", nodes] if nodes else []))
    if out is None:
        return None
    states: dict[str, bool] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            usable = not parts[1].endswith("*") and not parts[1].rstrip("~#!%$@^-").startswith(_UNUSABLE)
            states[parts[0]] = states.get(parts[0], True) and usable
    return states


def _lost_nodes(job_id: str) -> list[str]:
    """The nodes of a job (e.g. one that ended NODE_FAIL) that Slurm now reports unusable, by sacct."""
    listed = _run("sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "NodeList")
    first = listed.strip().splitlines()[0] if listed and listed.strip() else ""
    return _unusable_of(first) if first and first != "None assigned" else []
