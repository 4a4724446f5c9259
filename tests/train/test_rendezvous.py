"""The rendezvous port (suite.train.rendezvous): outside the ephemeral range, the same on every
node for a job id, the next candidate when one is taken, and no wait without an end."""
import os
import socket
import threading
import time

import pytest

from suite.common.errors import SuiteError
from suite.common import ports as portlib
from suite.train import rendezvous


def test_the_ephemeral_range_is_read_from_the_kernel_file_with_a_default(tmp_path):
    f = tmp_path / "ip_local_port_range"
    f.write_text("40000\t50000\n")
    assert portlib.ephemeral_range(f) == (40000, 50000)
    assert portlib.ephemeral_range(tmp_path / "absent") == portlib.EPHEMERAL_DEFAULT


@pytest.mark.parametrize("ephemeral", [(32768, 60999), (20000, 40000), (1024, 60000), (40000, 65535)])
def test_candidates_lie_outside_the_ephemeral_range(ephemeral):
    low, high = ephemeral
    for seed in range(200):
        ports = portlib.candidate_ports(str(seed), ephemeral)
        assert len(ports) == rendezvous.CANDIDATES == len(set(ports))
        assert all(not (low <= p <= high) and 1024 <= p <= 65535 for p in ports), (seed, ports)


def test_candidates_are_the_same_for_one_job_id_and_differ_between_jobs():
    assert portlib.candidate_ports("4242", (32768, 60999)) == portlib.candidate_ports("4242", (32768, 60999))
    firsts = {portlib.candidate_ports(str(j), (32768, 60999))[0] for j in range(100)}
    assert len(firsts) > 90


def test_a_range_that_covers_every_port_is_refused_with_the_fix():
    with pytest.raises(SuiteError, match="ip_local_port_range"):
        portlib.candidate_ports("1", (1024, 65535))


def test_free_port_is_outside_the_ephemeral_range():
    low, high = portlib.ephemeral_range()
    assert not low <= portlib.free_port() <= high


def _listen(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(4)
    return s


def test_rank_0_moves_to_the_next_candidate_when_its_port_is_taken_and_rank_1_follows(tmp_path):
    path = rendezvous.announcement(tmp_path, "job-taken", 0)
    first, second = portlib.candidate_ports("job-taken")[:2]
    squatter = _listen(first)  # something else listens on rank 0's first port
    joined = {}
    peer = threading.Thread(target=lambda: joined.update(port=rendezvous.join(path, 1, "127.0.0.1", 2, 30)[1]))
    peer.start()
    try:
        store, port = rendezvous.serve(path, "127.0.0.1", 2, 30)
        peer.join(30)
        assert port == second and joined["port"] == second
    finally:
        squatter.close()


def test_a_rank_whose_rank_0_never_announces_fails_within_its_timeout_naming_itself(tmp_path):
    path = rendezvous.announcement(tmp_path, "job-silent", 0)
    started = time.monotonic()
    with pytest.raises(SuiteError, match=r"rank 1 waited 2 s for rank 0 to announce"):
        rendezvous.join(path, 1, "127.0.0.1", 2, 2)
    assert time.monotonic() - started < 5


def test_every_candidate_taken_is_one_line_naming_the_ports(tmp_path):
    path = rendezvous.announcement(tmp_path, "job-full", 0)
    ports = portlib.candidate_ports("job-full")
    squatters = [_listen(p) for p in ports]
    try:
        with pytest.raises(SuiteError, match=f"rank 0 found every rendezvous port taken on 127.0.0.1 .*{ports[-1]}"):
            rendezvous.serve(path, "127.0.0.1", 2, 5)
    finally:
        for s in squatters:
            s.close()
    assert not path.exists()


def test_a_one_task_slurm_job_listens_on_a_port_outside_the_ephemeral_range(monkeypatch):
    """A Slurm job of one task (world size 1) still forms a group of one, whose store listens on
    MASTER_PORT. submitit's pick, seeded by the job id in 20000-60000, lies in the ephemeral range
    for most ids (job 179: 44591, which an outgoing connection held: EADDRINUSE in CI); the suite
    picks a free port outside it, as for every other rendezvous."""
    import submitit

    from suite.tasks.train import join_rendezvous

    # what join_rendezvous sets, restored after the test (setenv records the value to put back);
    # stale values a shell could hold: they must not name the group
    for var, stale in (("MASTER_PORT", "29500"), ("MASTER_ADDR", "n9"), ("WORLD_SIZE", "4"), ("RANK", "3"),
                       ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2"), ("SCALESUITE_RENDEZVOUS", "x")):
        monkeypatch.setenv(var, stale)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    for var, value in {"SLURM_JOB_ID": "179", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                       "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1"}.items():
        monkeypatch.setenv(var, value)
    env = submitit.JobEnvironment()
    assert env.num_tasks == 1
    monkeypatch.delenv("MASTER_PORT")  # submitit's own pick, as a fresh job has it
    submitits = submitit.helpers.TorchDistributedEnvironment().master_port
    monkeypatch.setenv("MASTER_PORT", "29500")
    low, high = portlib.ephemeral_range()
    assert low <= submitits <= high  # the pick this replaces, for this job id
    join_rendezvous(env, None, None)
    port = int(os.environ["MASTER_PORT"])
    assert not (low <= port <= high) and port != submitits
    assert [os.environ[v] for v in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")] == \
        ["1", "0", "0", "1", "127.0.0.1"]
    assert "SCALESUITE_RENDEZVOUS" not in os.environ
