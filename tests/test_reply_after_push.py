"""A reply right behind a notification on the same connection is not held back: the daemon's connections have
TCP_NODELAY, so a small write that follows another one still unacknowledged goes out at once instead of waiting
for the client's delayed ACK (40 ms on Linux). Measured on the daemon as the tests run it: asyncio's own loop,
the one that left TCP_NODELAY off on the connections of a socket made with proto 0 (uvloop sets it anyway).

Each measure alternates requests whose handling pushes a notification to the caller's own connection just before
the reply (a mailbox message to oneself) with requests of another agent's connection, to which nothing is pushed,
and compares their medians."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable

import pytest
from websockets.asyncio.client import ClientConnection, connect

from memento_sessions.client import Client
from memento_sessions.coordination.intents import OVERLAP_SUBJECT
from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio
ROUNDS = 30
# The three measures of the connection itself run on single Redis only: on a cluster a push, published on another
# node, mostly reaches the daemon after the reply has gone, leaving nothing to measure.
ON_SINGLE_REDIS = pytest.mark.topology_independent
SLACK_MS = 10.0  # the delay this guards against is 40 ms; a loaded 2-core machine adds a few ms of noise


def ws_url(daemon: Daemon) -> str:
    return f"ws://127.0.0.1:{daemon.port}/ws"


async def medians(pushed: Callable[[], Awaitable[object]], quiet: Callable[[], Awaitable[object]]
                  ) -> tuple[float, float]:
    """Median milliseconds of `pushed` and of `quiet`, run alternately ROUNDS times each."""
    times: dict[str, list[float]] = {"pushed": [], "quiet": []}
    for _ in range(ROUNDS):
        for name, request in (("pushed", pushed), ("quiet", quiet)):
            started = time.perf_counter()
            await request()
            times[name].append((time.perf_counter() - started) * 1000)
    return statistics.median(times["pushed"]), statistics.median(times["quiet"])


class Raw:
    """A bare `websockets` client: requests one at a time, counting the notifications that came before each
    reply."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0
        self.before_reply: list[int] = []  # per request: notifications received between it and its reply

    async def request(self, method: str, params: dict[str, object]) -> dict[str, object]:
        self.next_id += 1
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}))
        seen = 0
        while True:
            message = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
            if "id" not in message:
                seen += 1
                continue
            assert message["id"] == self.next_id and "error" not in message, message
            self.before_reply.append(seen)
            result: dict[str, object] = message["result"]
            return result


@ON_SINGLE_REDIS
async def test_a_reply_behind_a_notification_is_not_delayed_for_a_raw_websockets_client(
        daemon: Daemon, namespace: str) -> None:
    def headers(agent: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token(agent, namespace)}"}

    async with connect(ws_url(daemon), additional_headers=headers("a"), compression=None) as a_ws, \
            connect(ws_url(daemon), additional_headers=headers("c"), compression=None) as c_ws:
        a, c = Raw(a_ws), Raw(c_ws)
        pushed, quiet = await medians(lambda: a.request("mailbox.send", {"to": "a", "body": "note"}),
                                      lambda: c.request("mailbox.read", {"limit": 1}))
    # The case measured, for the median: most replies came right behind a push.
    assert sum(1 for seen in a.before_reply if seen) > ROUNDS // 2, a.before_reply
    assert c.before_reply == [0] * ROUNDS
    assert pushed <= quiet + SLACK_MS, (pushed, quiet)


@ON_SINGLE_REDIS
async def test_a_reply_behind_a_notification_is_not_delayed_for_the_python_client(
        daemon: Daemon, namespace: str) -> None:
    async with Client(ws_url(daemon), token("a", namespace)) as a, Client(ws_url(daemon), token("c", namespace)) as c:
        pushed, quiet = await medians(lambda: a.call("mailbox.send", {"to": "a", "body": "note"}),
                                      lambda: c.call("mailbox.read", {"limit": 1}))
    assert pushed <= quiet + SLACK_MS, (pushed, quiet)


@ON_SINGLE_REDIS
async def test_a_keep_alive_http_request_is_answered_without_waiting_for_an_ack(daemon: Daemon) -> None:
    """uvicorn writes a response's head and body apart: the body must not wait for the client's ACK of the head
    (the hooks' POSTs are answered so)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    times = []
    try:
        for _ in range(ROUNDS):
            started = time.perf_counter()
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: memento\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await asyncio.wait_for(reader.readexactly(length), 10)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert statistics.median(times) <= SLACK_MS, times


async def test_the_declaring_agent_is_pushed_its_overlaps_and_its_reply_is_not_delayed(
        daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b, \
            rpc(daemon.port, token("c", namespace)) as c:
        held = await b.call("lease.acquire", {"entityIds": ["file:held.py"], "ttl": 60, "mode": "exclusive"})
        intent = await a.call("lease.acquire", {"entityIds": ["file:held.py"], "ttl": 60, "mode": "intent"})
        assert [overlap["leaseId"] for overlap in intent["overlaps"]] == [held["leaseId"]]
        told = (await a.notification(OVERLAP_SUBJECT, timeout=2))["params"]
        assert told["messageId"] == f"intent:{intent['leaseId']}:a" and told["body"]["overlaps"] == intent["overlaps"]

        overlapping = {"entityIds": ["file:held.py"], "ttl": 60, "mode": "intent"}
        alone = {"entityIds": ["file:free.py"], "ttl": 60, "mode": "intent"}
        pushed, quiet = await medians(lambda: a.call("lease.acquire", overlapping),
                                      lambda: c.call("lease.acquire", alone))
    assert sum(1 for note in a.notifications if note["method"] == OVERLAP_SUBJECT) > ROUNDS // 2
    assert c.notifications == []
    assert pushed <= quiet + SLACK_MS, (pushed, quiet)
