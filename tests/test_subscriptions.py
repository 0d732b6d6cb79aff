"""Subscriptions over real sockets and Redis: replay then live, gap-free, across daemons and reconnects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from memento_sessions import keys
from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import SECRET, make_settings, sample, token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = pytest.mark.anyio


async def events_until(peer: RpcSocket, last: int, timeout: float = 20) -> list[int]:
    """Seqs of session.event notifications, in arrival order, until `last` arrived."""
    seqs: list[int] = []
    with anyio.fail_after(timeout):
        while not seqs or seqs[-1] < last:
            seqs.append((await peer.notification("session.event"))["params"]["seq"])
    return seqs


async def emit_many(port: int, namespace: str, sid: str, agent: str, count: int, pause: float = 0.0) -> None:
    async with rpc(port, token(agent, namespace)) as peer:
        for i in range(count):
            await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "data": {"i": i}}})
            if pause:
                await anyio.sleep(pause)


async def test_subscribe_replays_then_goes_live_in_order(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        for i in range(5):
            await a.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": f"e{i}"}})
        sub = await b.call("session.subscribe", {"sessionId": sid, "since": 2})
        assert sub["seq"] == 5 and sub["recovered"] is True and len(sub["epoch"]) == 16
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "broke"}})
        first = await b.notification("session.event")
        assert first["params"]["sessionId"] == sid and first["params"]["event"]["id"] == "e2"
        assert [first["params"]["seq"], *await events_until(b, 6)] == [3, 4, 5, 6]
        live = await b.call("session.subscribe", {"sessionId": sid})
        assert live["recovered"] is False and live["seq"] == 6
        wrong_epoch = await b.call("session.subscribe", {"sessionId": sid, "since": 1, "epoch": "other"})
        assert wrong_epoch == {"seq": 6, "epoch": sub["epoch"], "recovered": False}
        beyond = await b.call("session.subscribe", {"sessionId": sid, "since": 99, "epoch": sub["epoch"]})
        assert beyond["recovered"] is False
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "test_pass"}})
        assert await events_until(b, 7) == [7], "no partial replay after recovered: false"
        await b.call("session.unsubscribe", {"sessionId": sid})
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}})
        await anyio.sleep(0.2)
        assert [n for n in b.notifications if n["method"] == "session.event"] == []
        assert (await b.error("session.subscribe", {"sessionId": "missing"}))["code"] == -32004


async def test_the_subscribe_reply_comes_before_the_first_replayed_event(daemon: Daemon, namespace: str) -> None:
    """Wrappers that await after the handler (presence) must not let the replay overtake the reply."""
    async with rpc(daemon.port, token("a", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified"}] * 50})
        for attempt in range(20):
            async with rpc(daemon.port, token(f"reader{attempt}", namespace)) as reader:
                reply = await reader.request("session.subscribe", {"sessionId": sid, "since": 0})
                assert reply["result"]["seq"] == 50
                early = [n["method"] for n in reader.notifications if n["method"] == "session.event"]
                assert early == [], f"attempt {attempt}: {len(early)} events arrived before the reply"
                assert await events_until(reader, 50) == list(range(1, 51))


async def test_replay_while_events_keep_arriving_has_no_gap_and_no_duplicate(daemon: Daemon,
                                                                             namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified"}] * 500})
    async with anyio.create_task_group() as tg:
        tg.start_soon(emit_many, daemon.port, namespace, sid, "writer", 300)
        await anyio.sleep(0.05)
        async with rpc(daemon.port, token("b", namespace)) as b:
            await b.call("session.subscribe", {"sessionId": sid, "since": 0})
            seqs = await events_until(b, 800)
    assert seqs == list(range(1, 801))


async def test_watch_announces_new_sessions(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("w", namespace)) as w, rpc(daemon.port, token("a", namespace)) as a:
        assert await w.call("sessions.watch", {}) == {}
        sid = (await a.call("session.create", {"labels": {"task": "t1"}}))["sessionId"]
        note = await w.notification("sessions.announce")
        assert note["params"] == {"type": "new", "sessionId": sid, "agentId": "a", "labels": {"task": "t1"}}


async def test_killing_the_pubsub_connection_loses_no_event(daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with rpc(daemon.port, token("a", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
    subscribers = [rpc(daemon.port, token(f"s{i}", namespace)) for i in range(3)]
    peers = [await s.__aenter__() for s in subscribers]
    for peer in peers:
        await peer.call("session.subscribe", {"sessionId": sid, "since": 0})
    async with anyio.create_task_group() as tg:
        tg.start_soon(emit_many, daemon.port, namespace, sid, "writer", 400, 0.001)
        await anyio.sleep(0.15)
        assert await r.client_kill_filter(_type="pubsub") >= 1
        await anyio.sleep(0.15)
        assert await r.client_kill_filter(_type="pubsub") >= 1
    for peer in peers:
        assert await events_until(peer, 400) == list(range(1, 401))
    for s in subscribers:
        await s.__aexit__(None, None, None)
    assert daemon.services is not None and daemon.services.fanout.reconnects >= 3
    await r.aclose()


async def test_a_catch_up_that_fails_is_retried_until_it_delivers_what_was_stored_meanwhile(
        daemon: Daemon, namespace: str) -> None:
    # A catch-up whose read failed with an error it did not know (a redirection past the driver's retries,
    # here WRONGTYPE) went live without its replay: an event stored while the pub/sub connection was down never
    # reached the subscriber. Every failure but a gone session is retried after the reconnect pauses.
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "e0"}})
        assert (await b.call("session.subscribe", {"sessionId": sid}))["seq"] == 1
        skeys = keys.session_keys(namespace, sid)
        (first,) = [str(member) for member in await r.zrange(skeys.events, 0, -1)]
        hidden = skeys.events + ":hidden"  # the same hash tag: the same slot on a cluster
        await r.rename(skeys.events, hidden)
        await r.set(skeys.events, "not a sorted set")
        with capture_logs() as logs:
            assert await r.client_kill_filter(_type="pubsub") >= 1  # reconnect: every subscription catches up
            with anyio.fail_after(10):
                while not any(line["event"].startswith("catch-up failed") for line in logs):
                    await anyio.sleep(0.02)
        # An event stored while the subscription was not listening: only the catch-up can deliver it.
        await r.delete(skeys.events)
        await r.rename(hidden, skeys.events)
        await r.zadd(skeys.events, {first.replace('{"seq":1,', '{"seq":2,').replace('"e0"', '"e1"'): 2})
        await r.hset(skeys.session, "seq", 2)
        note = await b.notification("session.event", 10)
        assert (note["params"]["seq"], note["params"]["event"]["id"]) == (2, "e1")
    await r.aclose()


async def test_a_subscriber_that_never_reads_is_closed_with_4008(daemon: Daemon, namespace: str) -> None:
    """The daemon buffers at most MEMENTO_WS_SEND_BUFFER bytes for a client, then drops it."""
    closes = sample("memento_ws_slow_consumer_closes_total")
    async with rpc(daemon.port, token("a", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        async with connect(f"ws://127.0.0.1:{daemon.port}/ws?token={token('lazy', namespace)}",
                           max_queue=1, max_size=2**20) as lazy:
            await lazy.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.subscribe",
                                        "params": {"sessionId": sid}}))
            await lazy.recv()
            lazy.transport.pause_reading()
            blob = "x" * 15000
            gateway = daemon.gateway
            assert gateway is not None
            peak = 0
            for _ in range(40):
                await a.call("event.emitBatch", {"sessionId": sid,
                                                 "events": [{"type": "modified", "data": {"b": blob}}] * 20})
                peak = max([peak, *(c.queued_bytes for c in gateway.connections)])
            assert peak <= daemon.settings.ws_send_buffer
            lazy.transport.resume_reading()
            with pytest.raises(ConnectionClosed) as closed:
                with anyio.fail_after(10):
                    while True:
                        await lazy.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4008
        # the publisher was never slowed: it is still served at once
        assert (await a.call("session.get", {"sessionId": sid, "limit": 1}))["session"]["seq"] == 800
    assert sample("memento_ws_slow_consumer_closes_total") == closes + 1


@asynccontextmanager
async def daemon_process(urls: Endpoints, tmp: Path) -> AsyncIterator[int]:
    """A real `memento-sessions serve` process on the shared backends; yields its port."""
    port = free_port()
    env = {**os.environ, "MEMENTO_REDIS_URL": urls.redis_url, "MEMENTO_POSTGRES_DSN": urls.postgres_dsn or "off",
           "MEMENTO_AUTH_SECRET": SECRET, "MEMENTO_PORT": str(port), "MEMENTO_DATA_DIR": str(tmp / str(port)),
           "MEMENTO_LOG_LEVEL": "warning"} | ({"MEMENTO_FALKORDB_URL": urls.falkordb_url} if urls.falkordb_url else {})
    proc = subprocess.Popen([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env)
    try:
        with anyio.fail_after(30):
            while True:
                try:
                    async with rpc(port, token("probe")):
                        break
                except OSError:
                    await anyio.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
async def test_two_daemon_processes_twenty_subscribers_five_emitters(backend_urls: Endpoints, tmp_path: Path,
                                                                     namespace: str) -> None:
    async with daemon_process(backend_urls, tmp_path) as one, daemon_process(backend_urls, tmp_path) as two:
        async with rpc(one, token("lead", namespace)) as lead:
            sid = (await lead.call("session.create", {}))["sessionId"]
        received: dict[int, list[int]] = {}

        async def subscriber(n: int, ready: Any) -> None:
            async with rpc(one if n % 2 else two, token(f"sub{n}", namespace)) as peer:
                await peer.call("session.subscribe", {"sessionId": sid, "since": 0})
                ready()
                received[n] = await events_until(peer, 500, timeout=60)

        async with anyio.create_task_group() as tg:
            for n in range(20):
                await tg.start(lambda task_status, n=n: subscriber(n, task_status.started))
            for e in range(5):
                tg.start_soon(emit_many, one if e % 2 else two, namespace, sid, f"emitter{e}", 100)
    assert len(received) == 20
    for seqs in received.values():
        assert seqs == list(range(1, 501))




async def test_a_session_created_anew_under_the_same_id_restarts_at_seq_1_with_a_new_epoch(
        daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        await a.call("session.create", {"sessionId": "again"})
        first = await b.call("session.subscribe", {"sessionId": "again"})
        await a.call("event.emitBatch", {"sessionId": "again", "events": [{"type": "modified"}] * 3})
        old = [(await b.notification("session.event"))["params"] for _ in range(3)]
        assert [(p["seq"], p["epoch"]) for p in old] == [(1, first["epoch"]), (2, first["epoch"]), (3, first["epoch"])]
        await r.delete(*keys.session_keys(namespace, "again").all())  # as if Redis expired it
        await a.call("session.create", {"sessionId": "again"})
        await a.call("event.emit", {"sessionId": "again", "event": {"type": "broke"}})
        new = (await b.notification("session.event"))["params"]
        assert new["seq"] == 1 and new["epoch"] != first["epoch"] and new["event"]["type"] == "broke"
    await r.aclose()


async def test_a_frame_over_1_mib_closes_with_1009_and_changes_nothing(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        huge = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "event.emit",
                           "params": {"sessionId": sid, "event": {"type": "x", "data": {"b": "x" * (1 << 20)}}}})
        await a.ws.send(huge)
        with pytest.raises(ConnectionClosed) as closed, anyio.fail_after(5):
            await a.ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    async with rpc(daemon.port, token("a", namespace)) as again:
        assert (await again.call("session.get", {"sessionId": sid}))["session"]["seq"] == 0


@pytest.mark.topology_independent  # WebSocket keepalive: no Redis in it
async def test_a_peer_that_stops_answering_pings_is_closed(backend_urls: Endpoints, tmp_path: Path,
                                                            namespace: str) -> None:
    """Keepalive: a ping unanswered for MEMENTO_WS_PING_INTERVAL closes the connection (default 20 s)."""
    async with running(make_settings(backend_urls, tmp_path, ws_ping_interval=0.5)) as d, \
            connect(f"ws://127.0.0.1:{d.port}/ws?token={token('mute', namespace)}", ping_interval=None) as mute:
        assert d.gateway is not None and len(d.gateway.connections) == 1
        mute.transport.pause_reading()  # alive, but reads nothing: no pong ever goes back
        with anyio.fail_after(5):
            while d.gateway.connections:
                await anyio.sleep(0.05)
