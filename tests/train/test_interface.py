"""Which network interface a rank talks on (suite.common.network, suite.train.dist.choose_network):
the route to the rendezvous address, or launch.interface; a bad one is a one-line error before
training. The 2-node case over shaped links is tests/submit/test_shaped_cluster.py."""
import os
import shutil
import subprocess
import sys

import pytest

from suite.common import network
from suite.common.errors import SuiteError
from suite.recipe import Launch
from suite.train import dist

needs_ip = pytest.mark.skipif(shutil.which("ip") is None, reason="no `ip` command (iproute2) to ask the route")


def test_route_output_is_parsed():
    assert network.parse_route("8.8.8.8 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0\n    cache") == \
        {"dev": "eth0", "src": "192.0.2.2", "local": False}
    assert network.parse_route("local 127.0.0.1 dev lo src 127.0.0.1 uid 0")["local"]


@needs_ip
def test_the_route_to_127_0_0_1_is_lo():
    chosen = network.choose_interface("127.0.0.1")
    assert chosen["interface"] == "lo" and chosen["address"] == "127.0.0.1"


def test_an_interface_that_does_not_exist_is_one_line_naming_those_that_do():
    with pytest.raises(SuiteError) as e:
        network.choose_interface("127.0.0.1", "nosuch0")
    message = str(e.value)
    assert "\n" not in message and "nosuch0" in message
    assert all(name in message for name in network.interfaces()) and "lo" in network.interfaces()


@needs_ip
def test_lo_cannot_reach_a_master_elsewhere():
    with pytest.raises(SuiteError, match="cannot reach"):
        network.choose_interface("198.18.255.254", "lo")


@needs_ip
def test_choose_network_exports_the_interface_for_gloo_and_nccl(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "keepme0")  # the environment's own wins over the route
    monkeypatch.setattr(dist, "chosen_network", None)
    chosen = dist.choose_network()
    assert chosen["interface"] == "lo" and dist.chosen_network is chosen
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo" and os.environ["NCCL_SOCKET_IFNAME"] == "keepme0"
    dist.choose_network("lo")  # launch.interface wins over the environment
    assert os.environ["NCCL_SOCKET_IFNAME"] == "lo"


def test_launch_interface_is_a_recipe_key():
    assert Launch().interface is None and Launch(interface="eth0").interface == "eth0"


@pytest.mark.slow
def test_a_missing_interface_fails_the_submission_before_training_with_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "suite.submit", "recipes/quickstart.yaml", "--out", str(tmp_path),
                           "launch.interface=nosuch0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "nosuch0" in proc.stderr and "lo" in proc.stderr
    assert not any(tmp_path.iterdir())
