"""Sharded pub/sub on a Redis Cluster: SSUBSCRIBE per session channel, one connection per primary.

A session's channel carries the session's hash tag, so its Function SPUBLISHes it on the primary that
holds the session, and only that primary's subscribers get the frame: nothing crosses the cluster bus,
and a daemon with no listener for a shard's sessions gets none of its traffic. A shard's connection is
opened with the first local listener of one of its channels and closed with the last.

A connection subscribes its channels one SSUBSCRIBE per hash slot: Redis refuses (CROSSSLOT) an SSUBSCRIBE
whose channels are in different slots, even on the one primary that holds them all.

When a shard's connection ends (the primary failed over, restarted, or killed it) or Redis moves a slot
(it then unsubscribes the slot's channels itself), the topology is read again and every channel is
subscribed on its primary anew; the fan-out then tells its listeners to catch up from the stored history.
A connection that ends again soon after is reopened after the backoff policy's pause (retry.RECONNECT by
default), growing with each loss in a row of that primary's connection: never a loop without a pause.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from typing import Any

import anyio
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError

from memento_sessions.logs import get_logger
from memento_sessions.metrics import BACKEND_ERRORS
from memento_sessions.redisio.pubsub import Push, Subscriber, open_subscriber
from memento_sessions.retry import RECONNECT, Backoff, Failures
from memento_sessions.settings import ClusterUrl

log = get_logger(__name__)
Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


class Shard:
    """The SSUBSCRIBE connection to one primary and the channels it carries."""

    def __init__(self, name: str, url: str, owner: Shards) -> None:
        self.name, self.url, self.owner = name, url, owner
        self.channels: set[str] = set()
        self.subscriber: Subscriber | None = None
        self.closing = False
        # SUNSUBSCRIBEs sent on this connection and not yet answered, per channel: their replies are ours, and
        # only an unasked one means Redis moved the channel's slot away.
        self.leaving: dict[str, int] = {}

    def add(self, channel: str) -> None:
        self.channels.add(channel)
        if self.subscriber is not None:
            self.subscriber.command("SSUBSCRIBE", channel)

    def remove(self, channel: str) -> None:
        self.channels.discard(channel)
        if self.subscriber is not None:
            self.subscriber.command("SUNSUBSCRIBE", channel)
            self.leaving[channel] = self.leaving.get(channel, 0) + 1

    def on_push(self, reply: list[Any]) -> None:
        if reply[0] != "sunsubscribe":
            self.owner.on_push(reply)
        elif (asked := self.leaving.get(reply[1], 0)) > 1:
            self.leaving[reply[1]] = asked - 1
        elif asked:
            del self.leaving[reply[1]]
        else:
            self.owner.moved(reply[1], self)

    async def run(self) -> None:
        """Connect, subscribe every channel, and hand them back to the owner when the connection ends."""
        reason: BaseException | None
        opened = time.monotonic()
        try:
            subscriber = await open_subscriber(self.url, self.on_push)
        except (RedisError, OSError) as exc:
            reason = exc
        else:
            if self.closing:
                subscriber.close()
                return
            self.subscriber = subscriber
            for channels in by_slot(self.channels):
                subscriber.command("SSUBSCRIBE", *channels)
            reason = await subscriber.closed
            self.subscriber = None
            subscriber.close()
        if not self.closing:
            BACKEND_ERRORS.labels("redis").inc()
            self.owner.lost(self, reason, held=time.monotonic() - opened)

    def close(self) -> None:
        """Drop the connection for good (its last channel left)."""
        self.closing = True
        if self.subscriber is not None:
            self.subscriber.close()


class Shards:
    """Which primary's connection carries each sharded channel that has local listeners."""

    def __init__(self, url: ClusterUrl, topology: RedisCluster, on_push: Push, spawn: Spawn,
                 listeners: Mapping[str, Collection[object]], resubscribed: Callable[[str], None],
                 backoff: Backoff = RECONNECT) -> None:
        """`listeners`: the fan-out's channels (a channel without listeners is not resubscribed);
        `resubscribed(channel)`: called before a channel is subscribed anew (its listeners must catch up);
        `backoff`: the pauses before a lost connection is opened again."""
        self.url, self.topology, self.on_push, self.spawn = url, topology, on_push, spawn
        self.listeners, self.resubscribed = listeners, resubscribed
        self.backoff = backoff
        self.conns: dict[str, Shard] = {}
        self.home: dict[str, Shard] = {}
        self.losses = 0  # shard connections that ended without being closed
        self.failures: dict[str, Failures] = {}  # per primary: its connection's losses in a row

    async def add(self, channel: str) -> None:
        """Subscribe `channel` on its primary's connection (opened if it is the shard's first)."""
        await self.topology.initialize()
        if channel in self.home or channel not in self.listeners:  # its listeners may have left meanwhile
            return
        node = self.topology.nodes_manager.get_node_from_slot(key_slot(channel.encode()))
        shard = self.conns.get(node.name)
        if shard is None:
            shard = self.conns[node.name] = Shard(node.name, self.url.node_url(node.host, int(node.port)), self)
            self.spawn(shard.run)
        self.home[channel] = shard
        shard.add(channel)

    def remove(self, channel: str) -> None:
        """Unsubscribe `channel`; its shard's connection closes with its last channel."""
        shard = self.home.pop(channel, None)
        if shard is None:
            return
        shard.remove(channel)
        if not shard.channels:
            shard.close()
            if self.conns.get(shard.name) is shard:
                del self.conns[shard.name]

    def moved(self, channel: str, shard: Shard) -> None:
        """Redis unsubscribed `channel` from `shard` itself (its slot moved): subscribe it where it lives now."""
        if self.home.get(channel) is shard and channel in self.listeners:
            shard.channels.discard(channel)
            del self.home[channel]
            self.spawn(lambda: self._rehome([channel]))

    def lost(self, shard: Shard, reason: BaseException | None, held: float) -> None:
        """`shard`'s connection ended after `held` seconds: every channel it carried goes to its primary of
        now, after a pause that grows with each loss in a row (one that held past the policy's cap resets it)."""
        self.losses += 1
        failures = self.failures.setdefault(shard.name, Failures(self.backoff))
        if held > self.backoff.cap:
            failures.succeeded()
        pause = failures.failed()
        log.warning("sharded pub/sub connection lost; resubscribing", shard=shard.name, reason=repr(reason),
                    retry_in=round(pause, 3))
        if self.conns.get(shard.name) is shard:
            del self.conns[shard.name]
        channels = [channel for channel in shard.channels if self.home.get(channel) is shard]
        for channel in channels:
            del self.home[channel]
        shard.closing = True
        self.spawn(lambda: self._rehome(channels, pause, failures))

    async def _rehome(self, channels: list[str], pause: float = 0.0, failures: Failures | None = None) -> None:
        failures = failures or Failures(self.backoff)
        await anyio.sleep(pause)
        while channels := [ch for ch in channels if ch in self.listeners and ch not in self.home]:
            try:
                await self.topology.nodes_manager.initialize()
                for channel in channels:
                    self.resubscribed(channel)
                    await self.add(channel)
                return
            except (RedisError, OSError) as exc:
                BACKEND_ERRORS.labels("redis").inc()
                pause = failures.failed()
                log.warning("cluster topology unreadable; retrying", error=repr(exc), retry_in=round(pause, 3))
            await anyio.sleep(pause)

    def close(self) -> None:
        """Close every shard's connection."""
        for shard in list(self.conns.values()):
            shard.close()
        self.conns, self.home = {}, {}


def by_slot(channels: Iterable[str]) -> list[list[str]]:
    """`channels` grouped by hash slot: one SSUBSCRIBE each (Redis refuses one across slots)."""
    groups: defaultdict[int, list[str]] = defaultdict(list)
    for channel in channels:
        groups[key_slot(channel.encode())].append(channel)
    return list(groups.values())
