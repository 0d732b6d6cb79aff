"""`chaos.py --cluster`: the run on a Redis Cluster of 3 primaries, each with a replica, instead of one Redis.

The cluster is tests/cluster.py's LocalCluster (every node with `appendfsync always`, a 2 s node timeout),
FalkorDB a standalone embedded Redis beside it. The actions that differ from a single Redis: the pub/sub
connections are killed on every primary; the primary of the session's slot is SIGKILLed, its replica
promoted, and the killed node started again (it comes back as the replica); the session's slot is migrated
to another primary while the agent emits (ASK, TRYAGAIN, MOVED).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import redis
from redis.crc import key_slot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for tests.cluster

from memento_sessions.embedded.redis import EmbeddedRedis
from tests.cluster import LocalCluster

NODE_TIMEOUT_MS = 2000


class ChaosCluster:
    """The cluster and its FalkorDB, with the chaos actions done to them."""

    def __init__(self, workdir: Path) -> None:
        self.cluster = LocalCluster(workdir / "cluster", replicas=1, node_timeout_ms=NODE_TIMEOUT_MS)
        self.falkordb = EmbeddedRedis(workdir / "falkordb")

    def start(self) -> None:
        self.falkordb.start()
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()
        self.falkordb.stop()

    @property
    def tcp_url(self) -> str:
        """The daemons' MEMENTO_REDIS_URL."""
        return self.cluster.url

    def env(self) -> dict[str, str]:
        """What the daemons need besides the Redis URL: the standalone FalkorDB."""
        return {"MEMENTO_FALKORDB_URL": self.falkordb.url}

    def client_for(self, key: str) -> redis.Redis:
        """A client of the primary that holds `key` now."""
        return self.cluster.client(self.cluster.port_of(key))

    def kill_pubsub(self) -> int:
        killed = 0
        for port in self.cluster.primaries():
            with self.cluster.client(port) as node:
                killed += int(node.client_kill_filter(_type="pubsub"))
        return killed

    def applied_fsync(self) -> str:
        with self.cluster.client(self.cluster.primaries()[0]) as node:
            reply: dict[str, str] = node.config_get("appendfsync")
        return reply.get("appendfsync", "?")

    def primary_sigkill(self, key: str) -> str:
        """SIGKILL the primary holding `key`; back once its replica is promoted and it is a replica again."""
        port = self.cluster.port_of(key)
        down = time.monotonic()
        self.cluster.kill(port)
        self.cluster.wait_promoted(port)
        promoted = time.monotonic() - down
        self.cluster.start_node(port)
        self.cluster.wait_ok()
        return (f"primary {port} SIGKILLed, replica {self.cluster.port_of(key)} promoted in {promoted:.1f}s, "
                f"{port} a replica again in {time.monotonic() - down:.1f}s")

    def migrate(self, key: str) -> str:
        """Move `key`'s slot to another primary, a few keys at a time."""
        slot = key_slot(key.encode())
        source = self.cluster.port_of(key)
        target = next(port for port in self.cluster.primaries() if port != source)
        moved = self.cluster.migrate(slot, target)
        return f"slot {slot} moved from {source} to {target} ({moved} keys)"
