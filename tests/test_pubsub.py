"""The daemon's raw pub/sub connection against the real embedded Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from memento_sessions.endpoints import Endpoints
from memento_sessions.redisio import fanout as fanout_module
from memento_sessions.redisio import pubsub
from memento_sessions.redisio.fanout import Fanout
from memento_sessions.redisio.pubsub import open_subscriber

pytestmark = pytest.mark.anyio


async def test_pushes_arrive_parsed_and_in_order(backend_urls: Endpoints, namespace: str) -> None:
    pushes: list[list[Any]] = []
    subscriber = await open_subscriber(backend_urls.redis_url, pushes.append)
    subscriber.command("SUBSCRIBE", f"{namespace}:a")
    publisher = aioredis.Redis.from_url(backend_urls.redis_url)
    with anyio.fail_after(5):
        while not pushes:
            await anyio.sleep(0.01)
    for i in range(50):
        await publisher.publish(f"{namespace}:a", f"frame {i} é")
    with anyio.fail_after(5):
        while len(pushes) < 51:
            await anyio.sleep(0.01)
    assert pushes[0] == ["subscribe", f"{namespace}:a", 1]
    assert pushes[1:] == [["message", f"{namespace}:a", f"frame {i} é"] for i in range(50)]
    subscriber.close()
    subscriber.close()
    assert await subscriber.closed is None
    await publisher.aclose()


async def test_a_server_that_stops_answering_is_dropped_by_keepalive(
        backend_urls: Endpoints, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pubsub, "KEEPALIVE", 0.2)
    subscriber = await open_subscriber(backend_urls.redis_url, lambda reply: None)
    subscriber.command("SUBSCRIBE", f"{namespace}:b")
    admin = aioredis.Redis.from_url(backend_urls.redis_url)
    await anyio.sleep(0.3)
    await admin.client_pause(2000)  # Redis stops answering every client: no PONG, no data
    with anyio.fail_after(2):
        reason = await asyncio.shield(subscriber.closed)
    assert isinstance(reason, TimeoutError) and "no data from Redis" in str(reason)
    await admin.client_unpause()
    await admin.aclose()


class Recorder:
    """A fan-out listener that writes down which listener got each message, in the order they were called."""

    def __init__(self, name: int, calls: list[tuple[int, str]]) -> None:
        self.name, self.calls = name, calls

    def on_message(self, data: str) -> None:
        self.calls.append((self.name, data))

    def on_reconnect(self) -> None:
        """Nothing stored to catch up from."""


async def test_fanout_delivers_in_subscription_order(backend_urls: Endpoints, namespace: str) -> None:
    # Listeners made first and attached in reverse: the order they are called in is the order they attached,
    # not the order of their addresses (a set's order, which made a subscriber's place in a fan-out a lottery).
    calls: list[tuple[int, str]] = []
    channel = f"{namespace}:order"
    listeners = [Recorder(n, calls) for n in range(30)]
    fanout = Fanout(backend_urls.redis_url, f"{namespace}:control")
    publisher = aioredis.Redis.from_url(backend_urls.redis_url)
    async with anyio.create_task_group() as tg:
        await tg.start(fanout.run)
        for listener in reversed(listeners):
            await fanout.attach(channel, listener)
        fanout.detach(channel, listeners[10])
        await fanout.attach(channel, listeners[10])  # attached anew: now the last
        await publisher.publish(channel, "one")
        await publisher.publish(channel, "two")
        with anyio.fail_after(5):
            while len(calls) < 60:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    await fanout.aclose()
    await publisher.aclose()
    order = [n for n in range(29, -1, -1) if n != 10] + [10]
    assert calls == [(n, "one") for n in order] + [(n, "two") for n in order]


async def test_an_attach_cut_off_before_redis_confirmed_it_is_confirmed_by_the_reconnect(
        backend_urls: Endpoints, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The SUBSCRIBE is sent, then the connection is lost unanswered (keepalive, Redis paused). The attach
    # returns once the reconnected connection's SUBSCRIBE is confirmed, instead of waiting out its timeout
    # (raised here to 30 s so that waiting it out fails the test) for an event the reconnect forgot.
    monkeypatch.setattr(pubsub, "KEEPALIVE", 0.2)
    monkeypatch.setattr(fanout_module, "CONFIRM_TIMEOUT", 30.0)
    calls: list[tuple[int, str]] = []
    channel = f"{namespace}:cut"
    fanout = Fanout(backend_urls.redis_url, f"{namespace}:control")
    admin = aioredis.Redis.from_url(backend_urls.redis_url)
    async with anyio.create_task_group() as tg:
        await tg.start(fanout.run)
        await fanout.attach(f"{namespace}:before", Recorder(0, calls))  # the connection is up
        reconnects = fanout.reconnects
        await admin.client_pause(1500)
        with anyio.fail_after(6):
            await fanout.attach(channel, Recorder(1, calls))
        assert fanout.reconnects > reconnects  # the SUBSCRIBE's connection was lost and made again
        await admin.publish(channel, "after")
        with anyio.fail_after(5):
            while not calls:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    await fanout.aclose()
    await admin.aclose()
    assert calls == [(1, "after")]
