"""The daemon's bounds (docs/security.md) over the real WebSocket API: every cap answers with its error, writes nothing,
keeps the connection open, and is counted; every reply is a page that fits the send buffer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from memento_sessions import keys
from memento_sessions.endpoints import Endpoints
from memento_sessions.kg.graph import Graph
from memento_sessions.metrics import EVENTS
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.sessions import manager as manager_module
from memento_sessions.sessions.models import KNOWN_TYPES
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def redis_client(backend_urls: Endpoints) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(backend_urls.redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def session_keys_exist(r: aioredis.Redis, namespace: str, sid: str) -> int:
    return int(await r.exists(*keys.session_keys(namespace, sid).all()))


async def test_emit_past_session_max_events_gets_session_full_and_writes_nothing(
        backend_urls: Endpoints, tmp_path: Path, namespace: str, redis_client: aioredis.Redis) -> None:
    async with running(make_settings(backend_urls, tmp_path, session_max_events=10)) as daemon, \
            rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        first = [{"type": "modified", "id": f"e{i}"} for i in range(8)]
        assert (await peer.call("event.emitBatch", {"sessionId": sid, "events": first}))["seqs"] == list(range(1, 9))
        refused_before = sample("memento_session_limit_refusals_total", reason="session_full")
        three = [{"type": "modified"}] * 3
        error = await peer.error("event.emitBatch", {"sessionId": sid, "events": three})
        assert error["code"] == -32009 and error["data"] == {"reason": "session_full"}
        assert error["message"] == "session full: 8 events stored, 3 more; at most 10 (MEMENTO_SESSION_MAX_EVENTS)"
        events_key = keys.session_keys(namespace, sid).events
        assert await redis_client.zcard(events_key) == 8
        assert await redis_client.hget(keys.session_keys(namespace, sid).session, "seq") == "8"
        # Replays of stored ids and an id repeated inside the batch take no room: 2 new events fit exactly.
        batch = [{"type": "modified", "id": "e0"}, {"type": "modified", "id": "n"}, {"type": "modified", "id": "n"},
                 {"type": "modified"}]
        assert (await peer.call("event.emitBatch", {"sessionId": sid, "events": batch}))["seqs"] == [1, 9, 9, 10]
        full = await peer.error("event.emit", {"sessionId": sid, "event": {"type": "broke"}})
        assert full["code"] == -32009 and full["data"] == {"reason": "session_full"}
        assert (await peer.call("event.emit", {"sessionId": sid, "event": {"type": "x", "id": "e3"}})) == {
            "seq": 4, "duplicate": True}
        assert await redis_client.zcard(events_key) == 10
        session = (await peer.call("session.get", {"sessionId": sid}))["session"]
        assert session["seq"] == 10 and session["state"] == "working"  # the refused `broke` set nothing
        assert sample("memento_session_limit_refusals_total", reason="session_full") == refused_before + 2


async def test_create_past_namespace_max_sessions_gets_namespace_full_until_one_expires(
        backend_urls: Endpoints, tmp_path: Path, namespace: str, redis_client: aioredis.Redis) -> None:
    async with running(make_settings(backend_urls, tmp_path, namespace_max_sessions=3)) as daemon, \
            rpc(daemon.port, token("alice", namespace)) as peer:
        sids = [(await peer.call("session.create", {"sessionId": f"s{i}"}))["sessionId"] for i in range(3)]
        refused_before = sample("memento_session_limit_refusals_total", reason="namespace_full")
        error = await peer.error("session.create", {"sessionId": "s3", "entityIds": ["a"]})
        assert error["code"] == -32009 and error["data"] == {"reason": "namespace_full"}
        assert error["message"] == "namespace full: 3 live sessions; at most 3 (MEMENTO_NAMESPACE_MAX_SESSIONS)"
        assert await session_keys_exist(redis_client, namespace, "s3") == 0
        assert await redis_client.zrange(keys.session_index(namespace), 0, -1) == sids
        assert (await peer.error("session.get", {"sessionId": "s3"}))["code"] == -32004
        assert sample("memento_session_limit_refusals_total", reason="namespace_full") == refused_before + 1
        # Another namespace is not affected.
        async with rpc(daemon.port, token("bob", namespace + "x")) as other:
            assert (await other.call("session.create", {}))["state"] == "working"
        # Redis expires s1 (its TTL runs out): its place is free for the next create, without waiting for the janitor.
        for key in keys.session_keys(namespace, "s1").all():
            await redis_client.pexpire(key, 1)
        await anyio.sleep(0.05)
        assert (await peer.call("session.create", {"sessionId": "s3", "entityIds": ["a"]}))["seq"] == 1
        assert sorted(await redis_client.zrange(keys.session_index(namespace), 0, -1)) == ["s0", "s2", "s3"]


async def test_a_create_that_fails_writes_nothing(daemon: Daemon, namespace: str,
                                                 redis_client: aioredis.Redis) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        huge = [f"{i:03d}" + "e" * 253 for i in range(256)]  # valid ids, but the start event is over 64 KiB
        error = await peer.error("session.create", {"sessionId": "big", "entityIds": huge})
        assert error["code"] == -32602 and error["data"][0]["field"] == "entityIds"
        nul = await peer.error("session.create", {"sessionId": "nul", "entityIds": ["a\u0000"]})
        assert nul["code"] == -32602 and nul["data"][0]["field"] == "entityIds.0"
        label = await peer.error("session.create", {"sessionId": "lab", "labels": {"k": "v\u0000"}})
        assert label["code"] == -32602 and label["data"][0]["field"] == "labels.k"
        for sid in ("big", "nul", "lab"):
            assert await session_keys_exist(redis_client, namespace, sid) == 0
            assert (await peer.error("session.get", {"sessionId": sid}))["code"] == -32004
        assert await redis_client.zcard(keys.session_index(namespace)) == 0
        # A taken id: -32009, and the existing session keeps its index place and its events.
        await peer.call("session.create", {"sessionId": "taken", "entityIds": ["a"]})
        taken = await peer.error("session.create", {"sessionId": "taken"})
        assert taken["code"] == -32009
        assert await redis_client.zrange(keys.session_index(namespace), 0, -1) == ["taken"]
        got = await peer.call("session.get", {"sessionId": "taken"})
        assert got["session"]["seq"] == 1 and [e["type"] for e in got["events"]] == ["start"]


async def test_session_get_pages_by_count_with_next_since(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        for _ in range(2):
            await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified"}] * 500})
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified"}] * 205})
        first = await peer.call("session.get", {"sessionId": sid})
        assert len(first["events"]) == 1000 and first["nextSince"] == 1000
        assert [e["seq"] for e in first["events"]] == list(range(1, 1001))
        rest = await peer.call("session.get", {"sessionId": sid, "since": first["nextSince"]})
        assert [e["seq"] for e in rest["events"]] == list(range(1001, 1206)) and "nextSince" not in rest
        limited = await peer.call("session.get", {"sessionId": sid, "since": 10, "limit": 5})
        assert [e["seq"] for e in limited["events"]] == [11, 12, 13, 14, 15] and limited["nextSince"] == 15
        exact = await peer.call("session.get", {"sessionId": sid, "since": 1200, "limit": 5})
        assert len(exact["events"]) == 5 and "nextSince" not in exact
        condensed = await peer.call("session.get", {"sessionId": sid, "condensed": True})
        assert condensed["counts"] == {"modified": 1205} and "truncated" not in condensed


async def test_no_reply_is_larger_than_the_send_buffer(backend_urls: Endpoints, tmp_path: Path,
                                                       namespace: str) -> None:
    buffer = 256 * 1024
    async with running(make_settings(backend_urls, tmp_path, ws_send_buffer=buffer)) as daemon, \
            rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        blob = "x" * 8000
        for _ in range(4):  # 40 events of ~8 KB: 320 KB in all, more than the buffer
            await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "m", "data": {"b": blob}}] * 10})
        seen, since, pages = [], 0, 0
        while True:
            await peer.ws.send(json.dumps({"jsonrpc": "2.0", "id": 1000 + pages, "method": "session.get",
                                           "params": {"sessionId": sid, "since": since}}))
            frame = await peer.ws.recv()
            assert len(frame) <= buffer // 2, len(frame)
            result = json.loads(frame)["result"]
            seen += [e["seq"] for e in result["events"]]
            pages += 1
            if "nextSince" not in result:
                break
            since = result["nextSince"]
        assert seen == list(range(1, 41)) and pages >= 5
        isolate = await peer.call("bridge.isolate", {"sessionId": sid, "agentId": "alice"})
        assert 1 <= len(isolate["events"]) < 40 and isolate["nextSince"] == isolate["events"][-1]["seq"]
        tail = await peer.call("bridge.isolate", {"sessionId": sid, "agentId": "alice", "since": 38})
        assert [e["seq"] for e in tail["events"]] == [39, 40] and "nextSince" not in tail


async def test_session_list_pages_with_a_cursor(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        made = [(await peer.call("session.create", {"sessionId": f"l{i}"}))["sessionId"] for i in range(7)]
        listed, cursor, pages = [], None, 0
        while True:
            params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
            result = await peer.call("session.list", params)
            listed += [s["sessionId"] for s in result["sessions"]]
            pages += 1
            cursor = result.get("nextCursor")
            if cursor is None:
                break
        assert sorted(listed) == sorted(made) and len(listed) == 7 and pages == 3
        bad = await peer.error("session.list", {"cursor": "nope"})
        assert bad["code"] == -32602 and bad["data"][0]["field"] == "cursor"


async def test_event_type_labels_and_counters_stay_bounded(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        other_before = sample("memento_events_total", type="other")
        events = [{"type": f"custom.{i}"} for i in range(300)]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": events})
        assert sample("memento_events_total", type="other") == other_before + 300
        labels = {sample.labels["type"] for metric in EVENTS.collect() for sample in metric.samples}
        assert labels <= {*KNOWN_TYPES, "other"}
        counter = manager_module.events_counter
        info = getattr(counter, "cache_info", None)
        assert info is None or info().currsize <= len(KNOWN_TYPES) + 1


async def test_kg_upsert_refuses_poison_props_and_writes_nothing(daemon: Daemon, namespace: str,
                                                                 graph: Graph) -> None:
    cases = [
        ({"nodes": [{"id": "a", "props": {"w": float("nan")}}]}, "nodes.0.props", "w: nan is not allowed"),
        ({"nodes": [{"id": "a", "props": {"w": float("inf")}}]}, "nodes.0.props", "w: inf is not allowed"),
        ({"nodes": [{"id": "a", "props": {"w": 2e12}}]}, "nodes.0.props", "w: 2e+12 is over 1e12"),
        ({"nodes": [{"id": "a", "props": {"s": ["ok", "x\u0000"]}}]}, "nodes.0.props", "s[1]: contains NUL"),
        ({"nodes": [{"id": "a\u0000b"}]}, "nodes.0.id", "control characters"),
        ({"edges": [{"from": "a", "to": "b\n", "type": "TESTS"}]}, "edges.0.to", "control characters"),
    ]
    async with rpc(daemon.port, token("loader", namespace, scope="kg:write sessions:read")) as peer:
        for params, field, message in cases:
            error = await peer.error("kg.upsert", params)
            assert error["code"] == -32602 and error["data"][0]["field"] == field, error
            assert message in error["data"][0]["message"], error
        assert list((await graph.query("MATCH (n) RETURN count(n)")).result_set) == [[0]]
        assert await peer.call("kg.upsert", {"nodes": [{"id": "a", "props": {"w": 1e12}}]}) == {"nodes": 1, "edges": 0}


def test_the_condensed_view_is_bounded_whatever_the_session_holds() -> None:
    from memento_sessions.sessions.condense import KEEP, Condenser

    folder = Condenser()
    for chunk in range(12):  # 2,400 events in chunks, as session.get folds them
        folder.add([{"seq": chunk * 200 + i + 1, "type": f"t{chunk * 200 + i}",
                     "changeInfo": {"entityIds": [f"e{chunk * 200 + i}", "hot"]},
                     "stateTransition": {"to": "broken" if i % 2 else "working"}, "impact": {"perfDelta": 1.0}}
                    for i in range(200)])
    view = folder.result()
    assert len(view["counts"]) == KEEP + 1 and view["counts"]["other"] == 2400 - KEEP
    assert len(view["entities"]) == KEEP and next(iter(view["entities"].items())) == ("hot", 2400)
    assert len(view["transitions"]) == KEEP and view["transitions"][-1]["seq"] == 2400
    assert view["truncated"] == ["counts", "entities", "transitions"] and view["perfDelta"] == 2400.0
