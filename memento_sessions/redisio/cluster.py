"""Redis Cluster for the hot path: Function calls routed by slot to one auto-pipelined connection per primary.

The topology (which primary serves which slot) and the slot of a key are redis-py's (`RedisCluster`'s
NodesManager, `key_slot`); the calls go out on this package's own Pipe, one per primary. Every key of a
session carries the session's hash tag, so one Function call touches one slot and one primary.

A MOVED reply (the slot has a new owner: a failover or a resharding) re-reads the topology and sends
the call to the new owner; an ASK reply (a slot half-way through a migration) sends ASKING and the call
to the named node, in one write; with `Acks`, the WAIT goes to the node that ran the call. A lost
connection is not retried (a Function may have run; see pipe.py): the topology is re-read before the
next call, so calls reach a promoted replica.
"""

from __future__ import annotations

import time
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from memento_sessions.logs import get_logger
from memento_sessions.redisio.pipe import Acks, Pipe
from memento_sessions.retry import RECONNECT, Backoff, Failures
from memento_sessions.settings import ClusterUrl, is_cluster

log = get_logger(__name__)
MAX_REDIRECTS = 5
REFRESH_EVERY = 0.2  # at most one topology read per this many seconds after lost connections
_KEYED_AT = {"FCALL": 3, "FCALL_RO": 3, "EVAL": 3, "EVALSHA": 3}


def key_of(args: tuple[str | int | float, ...]) -> str:
    """The key a command is routed by: the first key of an FCALL/EVAL, else the first argument."""
    at = _KEYED_AT.get(str(args[0]).upper(), 1)
    if at == 3 and int(args[2]) == 0:
        raise ValueError(f"{args[0]} {args[1]} without a key cannot be routed on a Redis Cluster")
    return str(args[at])


def redirect_of(error: ResponseError) -> tuple[str, str, int] | None:
    """(MOVED or ASK, host, port) of a redirection reply, else None."""
    word, _, rest = str(error).partition(" ")
    if word not in ("MOVED", "ASK"):
        return None
    _, _, address = rest.partition(" ")
    host, _, port = address.rpartition(":")
    return word, host.strip("[]"), int(port)


class ClusterPipe(Pipe):
    """Pipe's `call` on a Redis Cluster: one auto-pipelined Pipe per primary, chosen by the key's slot."""

    def __init__(self, url: str, topology: RedisCluster, spin_us: int = 0, backoff: Backoff = RECONNECT) -> None:
        """`topology`: a redis-py cluster client whose NodesManager knows the slots (the daemon's own);
        `backoff`: each primary's connection's pauses between failed connects."""
        self.url = ClusterUrl.parse(url)
        self.topology = topology
        self.spin_us = spin_us
        self.backoff = backoff
        self.pipes: dict[str, Pipe] = {}
        self._stale = False
        self._refreshed_at = 0.0
        self._unread = Failures(backoff)  # topology reads failed in a row (no node answered)

    async def call(self, *args: str | int | float) -> Any:
        """Send the command to the primary of its key's slot, following MOVED/ASK redirections."""
        return await self._routed(args, None)

    async def call_acked(self, acks: Acks, *args: str | int | float) -> Any:
        """`call`, answered once `acks.replicas` replicas of the primary that ran it hold its write: the WAIT
        goes to that primary (after a redirection, to the node that served the call)."""
        return await self._routed(args, acks)

    async def _routed(self, args: tuple[str | int | float, ...], acks: Acks | None) -> Any:
        await self._fresh()
        node = self.topology.nodes_manager.get_node_from_slot(key_slot(key_of(args).encode()))
        host, port, asking = node.host, int(node.port), False
        for _ in range(MAX_REDIRECTS):
            pipe = self._pipe(host, port)
            try:
                if asking:
                    return await pipe.call_asking(*args, acks=acks)
                return await (pipe.call(*args) if acks is None else pipe.call_acked(acks, *args))
            except RedisConnectionError:
                self._stale = True  # the primary may be gone: read the topology before the next call
                raise
            except ResponseError as exc:
                redirect = redirect_of(exc)
                if redirect is None:
                    raise
                kind, host, port = redirect
                asking = kind == "ASK"
                if not asking:
                    log.info("slot moved; reading the cluster topology", to=f"{host}:{port}")
                    self._stale = True
                    await self._fresh()
        raise RedisConnectionError(f"more than {MAX_REDIRECTS} cluster redirections for one call")

    async def _fresh(self) -> None:
        """Read the topology at first use and again after a MOVED or a lost connection (rate limited; after a
        read that found no node, not again before the backoff policy's pause: calls meanwhile fail at once)."""
        if (refused := self._unread.refusal()) is not None:
            raise RedisConnectionError(refused)
        try:
            await self._read_topology()
        except RedisConnectionError as exc:  # ClusterUnreachable (backends.py) among them
            self._unread.refuse(exc)
            raise
        if self._unread.count:
            self._unread.succeeded()

    async def _read_topology(self) -> None:
        await self.topology.initialize()  # at once when done already
        now = time.monotonic()
        if not self._stale or now - self._refreshed_at < REFRESH_EVERY:
            return
        self._refreshed_at = now
        await self.topology.nodes_manager.initialize()
        self._stale = False

    def _pipe(self, host: str, port: int) -> Pipe:
        name = f"{host}:{port}"
        pipe = self.pipes.get(name)
        if pipe is None:
            pipe = self.pipes[name] = Pipe(self.url.node_url(host, port), self.spin_us, self.backoff)
        return pipe

    def close(self) -> None:
        """Close every primary's connection; safe to call twice."""
        pipes, self.pipes = self.pipes, {}
        for pipe in pipes.values():
            pipe.close()


def open_pipe(url: str, redis: aioredis.Redis, spin_us: int = 0) -> Pipe | None:
    """The hot path's Pipe for `url`: one per primary on a Redis Cluster (`redis` is then the daemon's
    RedisCluster, whose topology it shares), one connection otherwise; None where resp.connect cannot go."""
    if is_cluster(url):
        return ClusterPipe(url, cast(RedisCluster, redis), spin_us)
    return Pipe(url, spin_us) if Pipe.supports(url) else None
