"""How often the follower asks Slurm for a job's state (suite/submit/follow.py, ``Watch._state_due``):
every ``state_every_s`` while the job runs, at every poll while a change is about to be seen."""
import json
import os
import time

from suite.submit import follow


class _SlurmJob:
    local = False
    job_id = "7"
    num_tasks = 2


def _watch(tmp_path):
    w = follow.Watch(_SlurmJob(), tmp_path, total_epochs=1, printer=lambda *a, **k: None)
    w.state, w._ran, w._state_at = "RUNNING", True, time.time()  # asked just now, seen running
    return w


def _summary(tmp_path, status, age_s=0.0):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"status": status}))
    written = time.time() - age_s
    os.utime(path, (written, written))


def test_a_running_slurm_job_is_asked_every_state_every_s_not_at_every_poll(tmp_path):
    w = _watch(tmp_path)
    _summary(tmp_path, "running")
    assert not w._state_due()
    w._state_at -= w.state_every_s
    assert w._state_due()


def test_once_the_ranks_wrote_their_end_slurm_is_asked_at_every_poll(tmp_path):
    w = _watch(tmp_path)
    for status in ("completed", "failed", "preempted", "cancelled"):
        _summary(tmp_path, status)
        assert w._state_due(), status


def test_an_end_written_before_this_attempt_or_long_ago_does_not_make_it_ask_at_every_poll(tmp_path):
    w = _watch(tmp_path)
    _summary(tmp_path, "failed", age_s=time.time() - w._since + 5)  # the attempt before this one
    assert not w._state_due()
    w._since -= 3600  # this attempt's, but older than QUICK_START_S: a requeued job pending for long
    _summary(tmp_path, "preempted", age_s=follow.QUICK_START_S + 1)
    assert not w._state_due()


def test_a_job_not_yet_seen_running_is_asked_at_every_poll_only_just_after_submission(tmp_path):
    w = _watch(tmp_path)
    w.state, w._ran = "PENDING", False
    assert w._state_due()
    w._since -= follow.QUICK_START_S + 1  # pending for a while: the usual cadence
    assert not w._state_due()
