"""Presence: who is in a session, active or idle, across daemons; joined/idle/active/left pushed."""

from __future__ import annotations

import gc
import json
import time
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest

from memento_sessions import keys
from memento_sessions.backends import Backends
from memento_sessions.coordination.presence import Conn, Presence
from memento_sessions.coordination.store import CoordStore
from memento_sessions.endpoints import Endpoints
from memento_sessions.redisio.cluster import open_pipe
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.sessions.manager import now_ms
from memento_sessions.settings import Settings
from tests.helpers import make_settings, token
from tests.rpcsocket import RpcSocket, rpc
from tests.test_leases import two_daemons

pytestmark = pytest.mark.anyio


async def statuses(sock: RpcSocket, until: str, timeout: float = 5.0,
                   agent: str | None = None) -> list[tuple[str, str]]:
    """The session.presence notifications (agent, status) received up to the first with status `until` (of
    `agent`, when given)."""
    seen: list[tuple[str, str]] = []
    while not seen or seen[-1][1] != until or (agent is not None and seen[-1][0] != agent):
        params = (await sock.notification("session.presence", timeout))["params"]
        seen.append((params["agentId"], params["status"]))
    return seen


async def test_presence_spans_daemons_and_is_pushed(backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with two_daemons(backend_urls, tmp_path) as (d1, d2), rpc(d1.port, token("a", namespace)) as a, \
            rpc(d2.port, token("b", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("session.subscribe", {"sessionId": sid})
        assert await statuses(a, "joined") == [("a", "joined")]
        await b.call("session.join", {"sessionId": sid})
        assert await statuses(a, "joined") == [("b", "joined")]
        for sock in (a, b):
            agents = (await sock.call("presence.get", {"sessionId": sid}))["agents"]
            assert [(x["agentId"], x["status"], x["connections"]) for x in agents] == [("a", "active", 1),
                                                                                      ("b", "active", 1)]
        await b.call("session.leave", {"sessionId": sid})
        assert await statuses(a, "left") == [("b", "left")]
        assert [x["agentId"] for x in (await a.call("presence.get", {"sessionId": sid}))["agents"]] == ["a"]


async def test_an_agent_without_requests_turns_idle_then_active(backend_urls: Endpoints, tmp_path: Path,
                                                               namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path, presence_idle=1.0)) as d, \
            rpc(d.port, token("a", namespace)) as a, rpc(d.port, token("b", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("session.subscribe", {"sessionId": sid})
        await b.call("session.join", {"sessionId": sid})
        started = time.monotonic()
        await statuses(a, "idle", timeout=5, agent="b")
        assert 1.0 <= time.monotonic() - started < 3.0  # MEMENTO_PRESENCE_IDLE=1 plus at most a heartbeat or two
        agents = {x["agentId"]: x["status"] for x in (await a.call("presence.get", {"sessionId": sid}))["agents"]}
        assert agents["b"] == "idle"
        await b.call("session.get", {"sessionId": sid})
        assert ("b", "active") in await statuses(a, "active", timeout=5, agent="b")


async def test_the_connect_hook_is_no_method_a_client_can_call(daemon: Daemon, namespace: str) -> None:
    """The gateway runs the registry's connect hooks itself; the old `rpc.connected` method is gone from the table."""
    async with rpc(daemon.port, token("a", namespace)) as a:
        assert (await a.error("rpc.connected", {}))["code"] == -32601
    assert daemon.services is not None and daemon.services.registry.on_connect  # coordination's hook is there
    assert not [name for name in daemon.services.registry.methods if name.startswith("rpc.")]


async def test_a_closed_connection_is_gone_at_once(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("session.subscribe", {"sessionId": sid})
        async with rpc(daemon.port, token("b", namespace)) as b:
            await b.call("session.subscribe", {"sessionId": sid})
            await b.call("session.join", {"sessionId": sid})
            agents = (await a.call("presence.get", {"sessionId": sid}))["agents"]
            assert [(x["agentId"], x["connections"]) for x in agents] == [("a", 1), ("b", 1)]
        assert ("b", "left") in await statuses(a, "left")
        with anyio.fail_after(2):
            while len((await a.call("presence.get", {"sessionId": sid}))["agents"]) != 1:
                await anyio.sleep(0.05)


async def test_presence_set_and_bad_inputs(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a:
        assert await a.call("presence.set", {"roles": ["reviewer", "tests"]}) == {"agentId": "a",
                                                                                  "roles": ["reviewer", "tests"]}
        error = await a.error("presence.set", {"roles": ["no spaces"]})
        assert error["code"] == -32602 and error["data"][0]["field"] == "roles.0"
        error = await a.error("presence.get", {"sessionId": "bad id"})
        assert error["code"] == -32602 and error["data"][0]["field"] == "sessionId"
        other = await a.call("presence.get", {"sessionId": "nobody-here"})
        assert other == {"agents": []}


async def test_the_agents_of_a_daemon_that_stopped_beating_are_gone(daemon: Daemon, namespace: str,
                                                                    backends: Backends) -> None:
    """A crashed daemon leaves its fields behind; three missed heartbeats (15 s by default) and they no longer
    count, so its agents are gone well within 60 s."""
    async with rpc(daemon.port, token("a", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("session.join", {"sessionId": sid})
        now = time.time_ns() // 1_000_000
        key = keys.presence_key(namespace, sid)
        await backends.redis.hset(key, mapping={
            "ghost/crashed": json.dumps({"c": 1, "r": now - 16_000, "h": now - 16_000}),
            "alive/other": json.dumps({"c": 2, "r": now - 40_000, "h": now - 1_000})})
        agents = (await a.call("presence.get", {"sessionId": sid}))["agents"]
        assert [(x["agentId"], x["status"], x["connections"]) for x in agents] == [("a", "active", 1),
                                                                                  ("alive", "idle", 2)]


class _Hung:
    """A connection's identity only (the presence bookkeeping reads nothing else of a closed peer)."""

    conn_id = "c-shutdown"


async def test_a_connection_closed_when_no_task_can_start_leaves_no_unawaited_presence_write(
        backends: Backends, settings: Settings, namespace: str) -> None:
    """Before the coordination task group starts and after it ends (a stopping daemon) presence has no way to
    run work: the update of a connection closing then is dropped whole. It used to be created anyway and never
    awaited: a RuntimeWarning, an error under the suite's -W error."""
    presence = Presence(CoordStore(backends.redis), settings, "d-shutdown")
    conn = Conn(namespace, "agent-s", _Hung(), now_ms(), {"s-1"})  # type: ignore[arg-type]
    presence.conns[conn.peer.conn_id] = conn
    assert presence.spawn is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        presence._closed(conn)
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
    assert presence.conns == {}


async def test_a_heartbeat_survives_sessions_joined_while_it_writes(backends: Backends, settings: Settings,
                                                                     namespace: str) -> None:
    """A beat awaits Redis for each session of each connection; a subscribe in between adds a session to that
    very connection. Iterating the live set then raised 'Set changed size during iteration', and the failed
    heartbeat ended the daemon (seen once in CI: test_ws_bounds on the cluster)."""
    presence = Presence(CoordStore(backends.redis), settings, "d-beat")
    conn = Conn(namespace, "agent-b", _Hung(), now_ms(), {f"s-{i}" for i in range(5)})  # type: ignore[arg-type]
    presence.conns[conn.peer.conn_id] = conn

    async def join_more() -> None:  # one join per Redis round trip, as subscribes come in while the beat writes
        for i in range(5, 50):
            await backends.redis.ping()
            conn.sessions.add(f"s-{i}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(join_more)
        await presence.beat_once()
    assert await backends.redis.exists(keys.presence_key(namespace, "s-0")) == 1


async def test_a_beat_over_10000_idle_connections_refreshes_every_agent_and_turns_each_idle(
        backends: Backends, settings: Settings, namespace: str) -> None:
    """The density case: 10,000 connections in no session. One beat marks every agent alive (its
    leases are not orphaned) and turns every connection idle, and writes no presence field; it takes well
    under its 5 s period (about 0.1 s here, busy host)."""
    presence = Presence(CoordStore(backends.redis), settings, "d-dense")
    long_ago = now_ms() - 10 * presence.idle_ms
    for n in range(10_000):
        conn = Conn(namespace, f"dense{n}", _Hung(), long_ago)  # type: ignore[arg-type]
        presence.conns[f"c-{n}"] = conn
    started, since = time.perf_counter(), now_ms()
    await presence.beat_once()
    took = time.perf_counter() - started
    alive = keys.lease_keys(namespace).alive
    assert await backends.redis.zcount(alive, since, "+inf") == 10_000
    assert all(conn.idle for conn in presence.conns.values())
    assert await backends.redis.keys(keys.presence_key(namespace, "*")) == []
    assert took < 2.0, f"a beat over 10,000 idle connections took {took:.2f} s"


async def test_a_beat_writes_each_agents_field_once_with_its_connection_count(
        backends: Backends, settings: Settings, namespace: str) -> None:
    """The fan-out case: 1,000 connections in sessions (500 agents with two each, 50 agents a session). One beat
    writes each (session, agent) field once, counting both connections, and a connection closed before the beat
    is not counted; the writes go out together, so the beat stays well under its period."""
    assert settings.redis_url is not None
    pipe = open_pipe(settings.redis_url, backends.redis)  # the daemon's store: the pipelined connection
    presence = Presence(CoordStore(backends.redis, pipe), settings, "d-crowd")
    for n in range(1000):
        agent = f"agent{n // 2}"
        conn = Conn(namespace, agent, _Hung(), now_ms(), {f"s-{(n // 2) % 10}"})  # type: ignore[arg-type]
        presence.conns[f"c-{n}"] = conn
    del presence.conns["c-1"]  # agent0's second connection closed
    started = time.perf_counter()
    await presence.beat_once()
    took = time.perf_counter() - started
    for session in range(10):
        fields = await backends.redis.hgetall(keys.presence_key(namespace, f"s-{session}"))
        assert len(fields) == 50
        counts = {str(name).split("/")[0]: json.loads(value)["c"] for name, value in fields.items()}
        assert set(counts.values()) == ({1, 2} if session == 0 else {2})
    agent0 = await backends.redis.hget(keys.presence_key(namespace, "s-0"), "agent0/d-crowd")
    assert agent0 is not None and json.loads(agent0)["c"] == 1
    if pipe is not None:
        pipe.close()
    assert took < 2.0, f"a beat over 1,000 connections in sessions took {took:.2f} s"


async def test_an_agent_is_present_by_its_own_live_fields_only(backends: Backends, settings: Settings,
                                                                namespace: str) -> None:
    """Whether an agent is present already (a `joined` is published only when it was not) reads only that
    agent's fields: another agent whose id it prefixes does not count, nor its own field on a daemon that
    stopped beating; its live field on another daemon does, among hundreds of others."""
    presence = Presence(CoordStore(backends.redis), settings, "d-here")
    key, now = keys.presence_key(namespace, "s-1"), now_ms()
    stale = now - int(presence.beat * 1000 * 4)
    fields: dict[Any, Any] = {f"other{n}/d-x": json.dumps({"c": 1, "r": now, "h": now}) for n in range(300)}
    fields["ab/d-x"] = json.dumps({"c": 1, "r": now, "h": now})
    fields["a/d-dead"] = json.dumps({"c": 1, "r": now, "h": stale})
    await backends.redis.hset(key, mapping=fields)
    assert not await presence._present(namespace, "s-1", "a")
    await backends.redis.hset(key, "a/d-live", json.dumps({"c": 1, "r": now, "h": now}))
    assert await presence._present(namespace, "s-1", "a")
    assert await presence._present(namespace, "s-1", "other299")
    assert not await presence._present(namespace, "s-1", "other3000")
