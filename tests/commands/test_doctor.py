"""python -m suite.doctor: the whole command on this machine's CPU, a wrong and a hung collective
each reported as a failed check with what it means, and the bandwidth arithmetic by hand."""
import json
import math
import os
import subprocess
import sys
import time

import pytest

from suite.common.errors import RunFailed

from suite.doctor import collectives, network, parity, versions
from suite.doctor.report import Check, check_lines, exit_code


@pytest.mark.slow
def test_quick_doctor_passes_on_this_machine(tmp_path):
    out = tmp_path / "doctor.json"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "suite.doctor", "--quick", "--json", str(out),
                           "--out", str(tmp_path / "parity")], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < 150, f"--quick took {took:.0f} s"
    # Progress: the table's rows and each check are printed, in order, as they are decided.
    lines = proc.stdout.splitlines()
    first_row = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["1", "KiB"])
    exact = next(i for i, ln in enumerate(lines) if ln.startswith("  PASS  gloo x2 all_reduce exact"))
    assert first_row < exact < next(i for i, ln in enumerate(lines) if "parity" in ln)

    report = json.loads(out.read_text())
    assert report["exit_code"] == 0 and report["failed"] == []
    checks = {c["name"]: c for c in report["checks"]}
    for kind in collectives.KINDS:
        assert checks[f"gloo x2 {kind} exact"]["status"] == "pass"
        assert checks[f"gloo x2 {kind} bandwidth"]["status"] == "pass"
    points = report["gloo"]["points"]["all_reduce"]
    assert [p["bytes"] for p in points] == [2**10 * 4**i for i in range(7)]  # 1 KiB .. 4 MiB
    for p in points:
        assert p["exact"] and p["count"] == p["bytes"] // 4
        assert 1e-6 < p["time_s"] < 1.0, p  # a 4 MiB all-reduce between 2 local ranks: about 2-10 ms here
        assert math.isclose(p["algbw_gb_s"], p["bytes"] / p["time_s"] / 1e9)
        assert math.isclose(p["busbw_gb_s"], p["algbw_gb_s"])  # 2(n-1)/n is 1 at n = 2
    # Large messages amortise the per-call latency: 4 MiB moves far more bytes per second than 1 KiB.
    assert points[-1]["busbw_gb_s"] > 10 * points[0]["busbw_gb_s"]
    assert points[-1]["busbw_gb_s"] > collectives.FLOOR_GB_S["gloo"]
    assert report["software"]["libraries"]["torch"] == versions.installed("torch")
    assert report["cpu"]["cores_usable"] == len(os.sched_getaffinity(0))
    assert report["cuda"]["gpus"] == []  # no GPU on this machine: gloo only, no nccl check
    assert not any(name.startswith("nccl") for name in checks)
    assert parity.certify_function() is not None  # suite.verify ships with the suite: the smoke must run
    assert checks["parity ddp vs single x2"]["status"] == "pass"
    assert report["parity"]["strategies"]["ddp"]["verdict"] == "equivalent"


def _off_by_one_on_rank_1(out, inp):
    """An all-reduce that sums correctly, then corrupts one element on rank 1 (a broken transport)."""
    import torch.distributed as dist

    dist.all_reduce(out)
    if dist.get_rank() == 1:
        out[3] += 1


def _hangs_on_rank_1(out, inp):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(out)


def _run_all_reduce(op, timeout_s: float = 60) -> list[Check]:
    checks = []
    collectives.check_backend("gloo", 2, [1024, 4096], warmup=1, iters=2, timeout_s=timeout_s, emit=checks.append,
                              line=lambda text: None, kinds=("all_reduce",), ops={"all_reduce": op} if op else None)
    return checks


def test_a_wrong_all_reduce_is_a_failed_check_with_its_meaning():
    checks = {c.name: c for c in _run_all_reduce(_off_by_one_on_rank_1)}
    wrong = checks["gloo x2 all_reduce exact"]
    assert wrong.status == "fail"
    # element 3: rank r gives (r + 1) + 2 * 3, so the sum over 2 ranks is 7 + 8 = 15
    assert "first at 1 KiB on rank 1: 1 of 256 elements off, element 3 is 16, should be 15" in wrong.detail
    assert "broken transport" in wrong.meaning and "mismatched torch / gloo builds" in wrong.meaning
    printed = "\n".join(check_lines(wrong))
    assert "FAIL" in printed and "means: all-reduce returns wrong numbers" in printed
    assert exit_code(list(checks.values())) == 1
    # The same run with the real all-reduce passes: the failure above is the injected fault's.
    assert {c.name: c.status for c in _run_all_reduce(None)}["gloo x2 all_reduce exact"] == "pass"


def test_a_hung_collective_is_a_failed_check_within_its_timeout():
    t0 = time.monotonic()
    checks = {c.name: c for c in _run_all_reduce(_hangs_on_rank_1, timeout_s=3)}
    assert time.monotonic() - t0 < 30
    hung = checks["gloo x2 all_reduce"]
    assert hung.status == "fail"
    assert hung.detail.startswith("all_reduce of 1 KiB did not finish within 3 s")
    assert "a collective hung" in hung.meaning and "GLOO_SOCKET_IFNAME" in hung.fix
    assert "gloo x2 all_reduce exact" not in checks


def test_bus_bandwidth_as_nccl_tests_computes_it():
    # all_reduce of 64 MiB in 10 ms on 4 ranks: 67108864 B / 0.01 s = 6.7108864 GB/s;
    # each rank sends and receives 2(n-1)/n = 1.5 of the buffer: busbw 10.0663296 GB/s.
    algbw, busbw = collectives.bus_bandwidth("all_reduce", 64 * 2**20, 0.01, 4)
    assert math.isclose(algbw, 6.7108864) and math.isclose(busbw, 10.0663296)
    # all_gather and reduce_scatter of 1 MiB in 1 ms on 8 ranks: (n-1)/n = 7/8 of 1.048576 GB/s.
    for kind in ("all_gather", "reduce_scatter"):
        algbw, busbw = collectives.bus_bandwidth(kind, 2**20, 1e-3, 8)
        assert math.isclose(algbw, 1.048576) and math.isclose(busbw, 0.917504)
    assert collectives.bus_bandwidth("all_reduce", 2**20, 1e-3, 2)[1] == collectives.bus_bandwidth("all_reduce", 2**20, 1e-3, 2)[0]


def test_bandwidth_below_the_floor_fails_and_says_why():
    point = {"bytes": 4 * 2**20, "time_s": 0.1, "algbw_gb_s": 0.042, "busbw_gb_s": 0.042}
    slow = collectives.bandwidth_check("bw", "all_reduce", "gloo", 2, [point], cores=2)
    assert slow.status == "fail" and "GLOO_SOCKET_IFNAME" in slow.fix
    crowded = collectives.bandwidth_check("bw", "all_reduce", "gloo", 8, [point], cores=2)
    assert "8 ranks on 2 cores" in crowded.meaning
    fast = collectives.bandwidth_check("bw", "all_reduce", "gloo", 2, [dict(point, busbw_gb_s=0.5)], cores=2)
    assert fast.status == "pass"
    one_gpu = collectives.bandwidth_check("bw", "all_reduce", "nccl", 1, [dict(point, busbw_gb_s=0.0)], cores=2)
    assert one_gpu.status == "info"


def test_versions_outside_the_tested_set_are_named_with_what_is_untested():
    from suite.compat import TESTED

    have = {lib: TESTED[lib] for lib in versions.LIBRARIES}
    assert versions.version_check(have).status == "pass"
    have.update(torch=TESTED["torch"] + "+cu130")  # a local build tag is the same release
    assert versions.version_check(have).status == "pass"
    have.update(deepspeed="0.19.9")
    off = versions.version_check(have)
    assert off.status == "warn" and off.detail.startswith(f"deepspeed 0.19.9 (tested {TESTED['deepspeed']}; untested: ")
    assert "zero and ds_pipeline" in off.detail and "constraints.txt" in off.fix
    have.update(wandb=None)
    assert versions.version_check(have).status == "fail"  # a missing library cannot run at all


def test_the_interface_gloo_would_use():
    up = {"lo": ["127.0.0.1"], "eth0": ["10.1.2.3"], "ib0": ["10.9.0.1"]}
    named = network.gloo_choice({"GLOO_SOCKET_IFNAME": "eth1"}, "node1", up)
    assert named["why"] == "GLOO_SOCKET_IFNAME" and named["missing"] == ["eth1"]
    here = network.gloo_choice({}, "localhost", up)
    assert here["interfaces"] == ["lo"] and here["loopback"]
    resolved = network.gloo_choice({}, "10.1.2.3", up)  # a host name resolving to eth0's address
    assert resolved["interfaces"] == ["eth0"] and not resolved["loopback"]
    assert network.nccl_choice({}, up)["interfaces"] == ["ib0"]  # NCCL takes InfiniBand first
    assert network.nccl_choice({}, {"lo": ["127.0.0.1"], "docker0": ["172.17.0.1"], "eth0": ["10.1.2.3"]})["interfaces"] == ["eth0"]


@pytest.mark.slow
@pytest.mark.parametrize("args, says", [(["--ranks", "1"], "--ranks 1: collectives need at least 2 ranks"),
                                        (["--timeout", "0"], "--timeout 0: give a positive number")])
def test_bad_usage_is_one_line_and_exit_2(args, says):
    proc = subprocess.run([sys.executable, "-m", "suite.doctor", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr


class _Certificate:
    """What suite.verify.certify_each returns, as far as the doctor reads it."""

    def __init__(self, verdict, first_bad_step, folder):
        self.verdict, self.first_bad_step, self.runs = verdict, first_bad_step, {"strategy": str(folder)}

    def lines(self):
        return ["step  single loss", "   1  2.30  0.0e+00  ok", "   2  2.20  3.1e-02  OVER", f"verdict {self.verdict}"]


def test_parity_differs_is_a_failed_check_naming_the_step(tmp_path):
    asked = []

    def certify_each(recipes, steps, out, progress):
        asked.append(([(r.strategy.name, r.world_size, r.launch.device) for r in recipes], steps, out))
        return [_Certificate("differs", 2, out / "fsdp-run") if r.strategy.name == "fsdp" else
                _Certificate("equivalent", None, out / "run") for r in recipes[:-1]] + [RunFailed("zero run failed")]

    checks = []
    found = parity.parity_smoke(2, 20, tmp_path, "cpu", checks.append, lambda text: None, certify=certify_each)
    # all three at once: certify_each shares single and its floor between them
    assert asked == [([("ddp", 2, "cpu"), ("fsdp", 2, "cpu"), ("zero", 2, "cpu")], 20, tmp_path)]
    by_name = {c.name: c for c in checks}
    assert by_name["parity ddp vs single x2"].status == "pass"
    bad = by_name["parity fsdp vs single x2"]
    assert bad.status == "fail" and "step 2  2.20  3.1e-02  OVER" in bad.detail
    assert "a strategy bug" in bad.meaning and str(tmp_path / "fsdp-run") in bad.fix
    failed = by_name["parity zero2 vs single x2"]  # one strategy's failed run fails its check only
    assert failed.status == "fail" and "did not run: zero run failed" in failed.detail
    assert found["zero2"] == {"error": "zero run failed", "folder": str(tmp_path)}


def test_parity_without_suite_verify_is_skipped_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(parity, "certify_function", lambda: None)
    checks = []
    parity.parity_smoke(2, 20, tmp_path, "cpu", checks.append, lambda text: None)
    assert [(c.name, c.status) for c in checks] == [("parity", "skip")]
    assert "suite.verify" in checks[0].detail


def test_no_parity_smoke_after_the_collectives_failed(monkeypatch, capsys):
    from suite.doctor import checkup

    def broken_backend(backend, world, sizes, *, emit, **kwargs):
        emit(Check(f"{backend} x{world} all_reduce exact", "fail", "wrong result"))
        return {}

    def parity_smoke(*args, **kwargs):
        raise AssertionError("the parity smoke ran over collectives that had failed")

    monkeypatch.setattr(collectives, "check_backend", broken_backend)
    monkeypatch.setattr(parity, "parity_smoke", parity_smoke)
    up = checkup.run(checkup.CheckupSpec(quick=True))
    skipped = up.checks[-1]
    assert (skipped.name, skipped.status) == ("parity", "skip")
    assert "gloo x2 all_reduce exact" in skipped.detail
    assert exit_code(up.checks) == 1
    assert "NOT healthy" in capsys.readouterr().out.splitlines()[-1]
