"""``python -m scripts.netns_cluster``: three replicad nodes, each in its own network namespace with its own
address and the default ports, exposed binds with API users and interserver credentials, ZooKeeper on the
bridge; rows inserted on node 1 reach every node; everything is removed after.  Root and iproute2 only."""

from __future__ import annotations

import subprocess
import sys

import pytest

from replicad.devtools.daemon import REPO, daemon_env
from scripts.netns_cluster import PREFIX, can_make_namespaces

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def test_three_nodes_in_network_namespaces_agree() -> None:
    why = can_make_namespaces()
    if why is not None:
        pytest.skip(f"network namespaces: {why}")
    r = subprocess.run([sys.executable, "-m", "scripts.netns_cluster", "--rows", "5000"], cwd=REPO,
                       env=daemon_env(), capture_output=True, text=True, timeout=360)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "every node holds the rows" in out
    for i in (1, 2, 3):
        assert f"http://10.77.0.{i}:8123" in out
    assert out.count("replicas 3/3 active") == 3, out[-4000:]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert PREFIX not in left
