"""A two-node Ray cluster on 127.0.0.1 (a head and a worker raylet, started and torn down
here): shards spread over the nodes, the worker node killed, a Ray restart restoring a shared
checkpoint on the other node, and only the dead shard respawned.

The driver runs in its own process (this test session's process is connected to its own
single-node Ray). Skipped where a second cluster cannot be started on this machine. Ray's CLI
refuses to join a worker node while ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, so this cluster's
processes get ``=1`` with every node's address given as ``127.0.0.1``, and
``RAY_AUTH_MODE=disabled`` (no token to share between the nodes).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multinode

RAY = str(Path(sys.executable).with_name("ray"))
TESTS = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pids_with(text: str) -> list[int]:
    """Processes whose command line holds ``text`` (this cluster's own temp dir or port)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split(None, 1)[0]) for line in out.splitlines()
            if text in line and "ps -eo" not in line and int(line.split(None, 1)[0]) != os.getpid()]


@pytest.fixture
def two_nodes(tmp_path_factory):
    temp = tmp_path_factory.mktemp("ray")  # this cluster's processes carry this path
    port, manager = _free_port(), _free_port()
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_AUTH_MODE": "disabled",
           "RAY_health_check_period_ms": "500",
           "RAY_health_check_failure_threshold": "4", "RAY_health_check_timeout_ms": "500"}
    common = ["--num-cpus=1", "--object-store-memory=80000000", "--disable-usage-stats",
              "--node-ip-address=127.0.0.1"]
    try:
        subprocess.run([RAY, "start", "--head", f"--port={port}", f"--temp-dir={temp}",
                        "--include-dashboard=false", *common], env=env, check=True,
                       capture_output=True, timeout=180)
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{port}",
                        f"--node-manager-port={manager}", *common], env=env, check=True,
                       capture_output=True, timeout=180)
    except (OSError, subprocess.SubprocessError) as err:
        for pid in _pids_with(str(temp)):
            os.kill(pid, signal.SIGKILL)
        pytest.skip(f"cannot start a two-node Ray cluster here: {err}")
    raylets = [p for p in _pids_with(f"--node_manager_port={manager}")]
    yield f"127.0.0.1:{port}", raylets, env, manager
    for pid in _pids_with(str(temp)) + _pids_with(f"--node_manager_port={manager}"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(1)


def test_node_loss_restart_and_respawn_on_two_nodes(two_nodes, tmp_path):
    address, raylets, env, manager = two_nodes
    raylet = next((p for p in raylets), None)
    assert raylet is not None, "the worker raylet was not found"
    shared = tmp_path / "shared"  # stands for storage every node mounts
    shared.mkdir()
    driver = subprocess.run([sys.executable, str(TESTS / "multinode_driver.py"), address,
                             str(shared), str(raylet), str(manager)], capture_output=True,
                            text=True,
                            timeout=280, env=env)
    assert driver.returncode == 0 and "OK" in driver.stdout.splitlines(), \
        driver.stdout[-3000:] + driver.stderr[-3000:]
