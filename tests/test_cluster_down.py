"""A daemon whose Redis Cluster is wholly down: every method answers -32050 (retryable), nothing logs a traceback,
and SIGTERM still stops it cleanly (exit code 0). The cluster is this test's own, so stopping it harms no other.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import pytest

from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from tests.cluster import LocalCluster
from tests.helpers import SECRET, falkordb_url, token
from tests.rpcsocket import rpc

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
METHODS = [
    ("session.create", {}),
    ("event.emit", {"sessionId": "SID", "event": {"type": "modified", "id": "after"}}),
    ("session.get", {"sessionId": "SID"}),
    ("session.list", {}),
    ("session.subscribe", {"sessionId": "SID"}),
]


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def serve(cluster: LocalCluster, urls: Endpoints, port: int, directory: Path) -> subprocess.Popen[bytes]:
    """`memento-sessions serve` on `cluster`, logging JSON lines to directory/serve.log."""
    graphs = falkordb_url(Endpoints(cluster.url, urls.postgres_dsn))
    assert graphs is not None and urls.postgres_dsn is not None
    env = {**os.environ, "MEMENTO_REDIS_URL": cluster.url, "MEMENTO_POSTGRES_DSN": urls.postgres_dsn,
           "MEMENTO_FALKORDB_URL": graphs, "MEMENTO_AUTH_SECRET": SECRET, "MEMENTO_PORT": str(port),
           "MEMENTO_DATA_DIR": str(directory / "data"), "MEMENTO_LOG_FORMAT": "json",
           "PYTHONPATH": str(Path(__file__).parents[1])}
    with open(directory / "serve.log", "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


async def wait_ready(proc: subprocess.Popen[bytes], port: int) -> None:
    with anyio.fail_after(60):
        while readyz(port) != 200:
            assert proc.poll() is None, "the daemon exited before it was ready"
            await anyio.sleep(0.1)


async def test_with_every_cluster_node_down_methods_answer_32050_and_sigterm_exits_0(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    cluster = LocalCluster(tmp_path / "cluster")
    cluster.start()
    port = free_port()
    proc = serve(cluster, backend_urls, port, tmp_path)
    try:
        await wait_ready(proc, port)
        async with rpc(port, token("a", namespace)) as peer:
            sid = (await peer.call("session.create", {}))["sessionId"]
            await peer.call("session.subscribe", {"sessionId": sid})  # a shard connection, lost with the cluster
            await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "before"}})
            await anyio.to_thread.run_sync(cluster.stop)
            errors = [await peer.error(method, json.loads(json.dumps(params).replace('"SID"', json.dumps(sid))))
                      for method, params in METHODS]
        await anyio.sleep(1)  # the reconnect loops run on a cluster that is gone
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            while proc.poll() is None:
                await anyio.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cluster.stop()
    log = (tmp_path / "serve.log").read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert [(error["code"], error.get("data")) for error in errors] == [(-32050, {"backend": "redis"})] * len(
        METHODS), errors
    assert proc.returncode == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert [line for line in lines if "exception" in line or line.get("level") == "error"] == []
    assert sum(line.get("event") == "backend unavailable" for line in lines) == len(METHODS)
    assert sum(line.get("level") == "warning" for line in lines) <= 80  # every reconnect loop backs off: ~9 each
