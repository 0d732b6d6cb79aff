"""One Redis pub/sub connection per daemon, shared by every local subscriber (plus, on a Redis Cluster,
one per primary for the sessions' sharded channels: shards.py).

Channels are subscribed when their first local listener arrives and dropped with the last; a message
reaches a channel's listeners in the order they attached, so a subscriber's place in a fan-out is the
same for every event. If Redis drops the connection (restart, `CLIENT KILL TYPE pubsub`), the loop
reconnects after the backoff policy's pause (retry.RECONNECT by default, also the shards'), re-subscribes
every channel and tells every listener to catch up from the ZSET by seq.

On a Redis Cluster, a session's channel (it carries the session's hash tag) is SSUBSCRIBEd on the
primary of its slot; the daemon's own channel and the namespaces' announcement channels (PUBLISHed,
which a cluster relays to every node) stay on this connection, made to any seed node that answers.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memento_sessions.backends import cluster_client
from memento_sessions.keys import sharded
from memento_sessions.logs import get_logger
from memento_sessions.metrics import BACKEND_ERRORS
from memento_sessions.redisio.pubsub import Subscriber, open_subscriber
from memento_sessions.redisio.shards import Shards
from memento_sessions.retry import RECONNECT, Backoff, Failures
from memento_sessions.settings import ClusterUrl, is_cluster

log = get_logger(__name__)
CONFIRM_TIMEOUT = 5.0
T = TypeVar("T")


class Listener(Protocol):
    """Something fed with the messages of one channel."""

    def on_message(self, data: str) -> None:
        """One published frame, in publish order."""

    def on_reconnect(self) -> None:
        """Messages may have been missed: catch up from the stored history."""


class Fanout:
    """Routes pub/sub messages of the daemon's one connection to local listeners."""

    def __init__(self, redis_url: str, control_channel: str, backoff: Backoff = RECONNECT) -> None:
        """`backoff`: the pauses of every reconnect, this connection's and each shard's."""
        self.url = redis_url
        self.backoff = backoff
        self.control = control_channel
        # Per channel, its listeners in subscription order (a dict as an ordered set): a message reaches them
        # first-come first-served, the same order every time, instead of a set's order by object address.
        self.listeners: dict[str, dict[Listener, None]] = {}
        self._confirmed: dict[str, anyio.Event] = {}
        self._subscriber: Subscriber | None = None
        self._catch_up = False
        self._stale: set[str] = set()  # sharded channels whose listeners catch up once resubscribed
        self._tg: TaskGroup | None = None
        self._connections = 0  # of the daemon's own connection, the first included
        self.urls = [redis_url]
        self.shards: Shards | None = None
        if is_cluster(redis_url):
            cluster = ClusterUrl.parse(redis_url)
            self.urls = [cluster.node_url(host, port) for host, port in cluster.nodes]
            self.shards = Shards(cluster, cluster_client(cluster), self._on_push, self.spawn, self.listeners,
                                 self._stale.add, backoff)

    @property
    def reconnects(self) -> int:
        """Connections made so far: the daemon's own (the first included) and every shard's lost one."""
        return self._connections + (self.shards.losses if self.shards is not None else 0)

    def _sharded(self, channel: str) -> bool:
        return self.shards is not None and sharded(channel)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the connection up forever, reconnecting after the backoff policy's pauses.

        Reports started at once: with Redis down the daemon still serves (/readyz says 503), and
        `attach` waits for the subscription to be confirmed. A connection that held past the policy's
        cap starts the backoff over.
        """
        failures = Failures(self.backoff)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            while True:
                opened = anyio.current_time()
                try:
                    error = await self._session()
                except (RedisError, OSError) as exc:
                    BACKEND_ERRORS.labels("redis").inc()
                    error = repr(exc)
                if anyio.current_time() - opened > self.backoff.cap:
                    failures.succeeded()
                pause = failures.failed()
                log.warning("pub/sub connection lost; reconnecting", error=error, retry_in=round(pause, 3))
                await anyio.sleep(pause)

    async def _session(self) -> str:
        """One connection, from its SUBSCRIBE to its end; why it ended."""
        try:
            subscriber = await open_subscriber(self.urls[0], self._on_push)
        except (RedisError, OSError):
            self.urls.append(self.urls.pop(0))  # on a cluster, the next seed node is tried next time
            raise
        self._connections += 1
        try:
            self._catch_up = self._connections > 1
            subscriber.command("SUBSCRIBE", self.control, *(ch for ch in self.listeners if not self._sharded(ch)))
            self._subscriber = subscriber
            return repr(await subscriber.closed)
        finally:
            self._subscriber = None
            # Confirmed subscriptions are confirmed anew by the next connection's SUBSCRIBE; an attach still
            # waiting keeps its event, which that SUBSCRIBE (every channel with listeners) then sets.
            self._confirmed = {channel: event for channel, event in self._confirmed.items() if not event.is_set()}
            subscriber.close()

    def _on_push(self, reply: list[Any]) -> None:
        kind = reply[0]
        if kind in ("message", "smessage"):
            data = reply[2]
            for listener in tuple(self.listeners.get(reply[1], ())):
                listener.on_message(data)
        elif kind in ("subscribe", "ssubscribe"):
            if reply[1] in self.listeners:  # a confirmation that comes after the last listener left keeps nothing
                self._confirmed.setdefault(reply[1], anyio.Event()).set()
            if reply[1] == self.control and self._catch_up:
                self._catch_up = False
                self._catch_up_all()
            elif reply[1] in self._stale:
                self._stale.discard(reply[1])
                self._catch_up_channel(reply[1])

    def _catch_up_all(self) -> None:
        for channel in [ch for ch in self.listeners if not self._sharded(ch)]:
            self._catch_up_channel(channel)

    def _catch_up_channel(self, channel: str) -> None:
        for listener in tuple(self.listeners.get(channel, ())):
            listener.on_reconnect()

    async def attach(self, channel: str, listener: Listener) -> None:
        """Feed `listener` from `channel`; returns once Redis confirmed the subscription."""
        listeners = self.listeners.setdefault(channel, {})
        listeners[listener] = None
        try:
            with anyio.fail_after(CONFIRM_TIMEOUT):
                if len(listeners) == 1 and self.shards is not None and sharded(channel):
                    await self.shards.add(channel)
                elif len(listeners) == 1 and self._subscriber is not None:
                    self._subscriber.command("SUBSCRIBE", channel)
                await self._confirmed.setdefault(channel, anyio.Event()).wait()
        except TimeoutError:
            raise RedisTimeoutError(f"Redis did not confirm the subscription to {channel} within "
                                    f"{CONFIRM_TIMEOUT}s") from None

    def detach(self, channel: str, listener: Listener) -> None:
        """Stop feeding `listener`; the channel is unsubscribed with its last listener."""
        listeners = self.listeners.get(channel)
        if listeners is None:
            return
        listeners.pop(listener, None)
        if not listeners:
            del self.listeners[channel]
            self._confirmed.pop(channel, None)
            self._stale.discard(channel)
            if self.shards is not None and sharded(channel):
                self.shards.remove(channel)
            elif self._subscriber is not None:
                self._subscriber.command("UNSUBSCRIBE", channel)

    def spawn(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run background work (a listener's catch-up, a shard's connection) in the fan-out's task group."""
        if self._tg is not None:
            self._tg.start_soon(contained, func)

    async def aclose(self) -> None:
        """Close the connections; safe twice."""
        if self._subscriber is not None:
            self._subscriber.close()
        if self.shards is not None:
            self.shards.close()
            await self.shards.topology.aclose()


def per_message(read: Callable[[str], T]) -> Callable[[str], T]:
    """`read`, computed once per message: every listener of a channel gets a message as the same str object
    (`_on_push` hands `reply[2]` to each in turn), so the last result serves them all."""
    last_frame, last = "", read("")

    def once(frame: str) -> T:
        nonlocal last_frame, last
        if frame is not last_frame:
            last, last_frame = read(frame), frame
        return last

    return once


async def contained(func: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run one background task; its failure is logged and ends it alone. Raised into the fan-out's task
    group it would end the group, and every later subscribe on the daemon would fail (seen on a cluster)."""
    try:
        await func()
    except Exception:
        log.exception("fan-out task failed")
