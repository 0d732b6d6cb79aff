"""Each bad input gets its JSON-RPC error with field details, writes nothing, and the socket stays open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = pytest.mark.anyio

BIG = "x" * (70 * 1024)
CASES: list[tuple[str, dict[str, Any], int, str]] = [
    # (what, event, code, field named in error.data)
    ("oversized event", {"type": "modified", "changeInfo": {"semanticHash": "h", "entityIds": [BIG[:256]] * 256}},
     -32602, "event"),
    ("oversized data", {"type": "modified", "data": {"blob": BIG}}, -32602, "event.data"),
    ("bad type", {"type": "Modified!"}, -32602, "event.type"),
    ("missing type", {"changeInfo": {}}, -32602, "event.type"),
    ("300 entityIds", {"type": "modified", "changeInfo": {"entityIds": [f"e{i}" for i in range(300)]}},
     -32602, "event.changeInfo.entityIds"),
    ("entity id too long", {"type": "modified", "changeInfo": {"entityIds": ["e" * 257]}}, -32602,
     "event.changeInfo.entityIds.0"),
    ("wrong enum", {"type": "modified", "impact": {"severity": "apocalyptic"}}, -32602, "event.impact.severity"),
    ("wrong transition", {"type": "x", "stateTransition": {"to": "sideways"}}, -32602, "event.stateTransition.to"),
    ("confidence above 1", {"type": "x", "stateTransition": {"to": "broken", "confidence": 1.5}}, -32602,
     "event.stateTransition.confidence"),
    ("negative lines", {"type": "x", "changeInfo": {"affectedLines": -1}}, -32602, "event.changeInfo.affectedLines"),
    ("unknown field", {"type": "x", "seq": 99}, -32602, "event.seq"),
    ("bad idempotency id", {"type": "x", "id": "has space"}, -32602, "event.id"),
    ("naive timestamp", {"type": "x", "timestamp": "2026-01-01T00:00:00"}, -32602, "event.timestamp"),
    ("another actor", {"type": "x", "actor": "mallory"}, -32001, "event.actor"),
    # Poison: values Redis takes but FalkorDB or Postgres JSONB cannot (json.dumps sends NaN/Infinity literally).
    ("NUL in an entity id", {"type": "modified", "changeInfo": {"entityIds": ["a\u0000b"]}}, -32602,
     "event.changeInfo.entityIds.0"),
    ("newline in an entity id", {"type": "modified", "changeInfo": {"entityIds": ["a\nb"]}}, -32602,
     "event.changeInfo.entityIds.0"),
    ("DEL in a failed test id", {"type": "broke", "impact": {"testsFailed": ["t\u007f"]}}, -32602,
     "event.impact.testsFailed.0"),
    ("perfDelta 1e308", {"type": "x", "impact": {"perfDelta": 1e308}}, -32602, "event.impact.perfDelta"),
    ("perfDelta over 1e12", {"type": "x", "impact": {"perfDelta": -1.5e12}}, -32602, "event.impact.perfDelta"),
    ("perfDelta NaN", {"type": "x", "impact": {"perfDelta": float("nan")}}, -32602, "event.impact.perfDelta"),
    ("perfDelta Infinity", {"type": "x", "impact": {"perfDelta": float("inf")}}, -32602, "event.impact.perfDelta"),
    ("confidence NaN", {"type": "x", "stateTransition": {"to": "broken", "confidence": float("nan")}}, -32602,
     "event.stateTransition.confidence"),
    ("affectedLines over 1e12", {"type": "x", "changeInfo": {"affectedLines": 10**13}}, -32602,
     "event.changeInfo.affectedLines"),
    ("NaN deep in data", {"type": "x", "data": {"a": [1, {"b": float("nan")}]}}, -32602, "event.data"),
    ("-Infinity in data", {"type": "x", "data": {"a": float("-inf")}}, -32602, "event.data"),
    ("huge integer in data", {"type": "x", "data": {"n": 10**30}}, -32602, "event.data"),
    ("NUL in a data string", {"type": "x", "data": {"text": "a\u0000"}}, -32602, "event.data"),
    ("NUL in a data key", {"type": "x", "data": {"k\u0000": 1}}, -32602, "event.data"),
    ("NUL in a nested data key", {"type": "x", "data": {"a": [{"k\u0000": "v"}]}}, -32602, "event.data"),
    ("1e16 in data (an exponent)", {"type": "x", "data": {"a": [1e16]}}, -32602, "event.data"),
    ("-1.5e300 in data", {"type": "x", "data": {"a": {"b": -1.5e300}}}, -32602, "event.data"),
    ("13-digit integer in a data list", {"type": "x", "data": {"a": [0, 10**12 + 1]}}, -32602, "event.data"),
    ("NUL in semanticHash", {"type": "x", "changeInfo": {"semanticHash": "h\u0000"}}, -32602,
     "event.changeInfo.semanticHash"),
    ("NUL in externalRef", {"type": "x", "impact": {"externalRef": "\u0000"}}, -32602, "event.impact.externalRef"),
]


async def stored(r: aioredis.Redis, namespace: str, sid: str) -> tuple[int, str | bytes | None, int]:
    skeys = keys.session_keys(namespace, sid)
    return await r.zcard(skeys.events), await r.hget(skeys.session, "seq"), await r.hlen(skeys.ids)


@pytest.fixture
async def session(daemon: Daemon, namespace: str) -> Any:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "first"}})
        r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
        yield peer, sid, r
        await r.aclose()


@pytest.mark.parametrize(("what", "event", "code", "field"), CASES, ids=[c[0] for c in CASES])
async def test_bad_event_is_refused_and_writes_nothing(session: tuple[RpcSocket, str, aioredis.Redis],
                                                       namespace: str, what: str, event: dict[str, Any],
                                                       code: int, field: str) -> None:
    peer, sid, r = session
    before = await stored(r, namespace, sid)
    error = await peer.error("event.emit", {"sessionId": sid, "event": event})
    assert error["code"] == code, error
    assert field in [item["field"] for item in error["data"]], error
    assert await stored(r, namespace, sid) == before
    assert (await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}}))["seq"] == 2


async def test_a_batch_with_one_bad_event_writes_none_of_it(session: tuple[RpcSocket, str, aioredis.Redis],
                                                           namespace: str) -> None:
    peer, sid, r = session
    before = await stored(r, namespace, sid)
    events = [{"type": "modified"}] * 3 + [{"type": "modified", "impact": {"severity": "huge"}}]
    error = await peer.error("event.emitBatch", {"sessionId": sid, "events": events})
    assert error["code"] == -32602 and error["data"][0]["field"] == "events.3.impact.severity"
    too_many = await peer.error("event.emitBatch", {"sessionId": sid, "events": [{"type": "m"}] * 501})
    assert too_many["code"] == -32602 and too_many["data"][0]["field"] == "events"
    assert await stored(r, namespace, sid) == before


async def test_poison_data_error_names_the_path(session: tuple[RpcSocket, str, aioredis.Redis],
                                                namespace: str) -> None:
    peer, sid, r = session
    before = await stored(r, namespace, sid)
    error = await peer.error("event.emit", {"sessionId": sid, "event": {"type": "x", "data": {"a": [0, {"b": 2e12}]}}})
    assert error["code"] == -32602
    assert error["data"] == [{"field": "event.data",
                              "message": "Value error, data.a[1].b: 2e+12 is over 1e12 in magnitude"}]
    nul = await peer.error("event.emit", {"sessionId": sid, "event": {"type": "x", "data": {"t": "\u0000"}}})
    assert nul["data"] == [{"field": "event.data",
                            "message": "Value error, data.t: contains NUL (\\u0000), which cannot be stored"}]
    at_bound = {"type": "x", "impact": {"perfDelta": 1e12}, "data": {"n": -10**12, "f": 0.5}}
    assert (await peer.call("event.emit", {"sessionId": sid, "event": at_bound}))["seq"] == 2  # 1e12 itself is fine
    assert (await r.zcard(keys.session_keys(namespace, sid).events)) == before[0] + 1


async def test_bad_params_and_frames(session: tuple[RpcSocket, str, aioredis.Redis], namespace: str) -> None:
    peer, sid, r = session
    before = await stored(r, namespace, sid)
    non_object = await peer.error("event.emit", [sid, {"type": "x"}])
    assert non_object["code"] == -32602 and non_object["data"] == [{"field": "params", "message": "must be an object"}]
    missing = await peer.error("event.emit", {"sessionId": sid})
    assert missing["code"] == -32602 and missing["data"][0]["field"] == "event"
    bad_sid = await peer.error("session.get", {"sessionId": "../../etc"})
    assert bad_sid["code"] == -32602 and bad_sid["data"][0]["field"] == "sessionId"
    ttl = await peer.error("session.create", {"ttl": 10})
    assert ttl["code"] == -32602 and ttl["data"][0]["field"] == "ttl"
    assert (await peer.error("no.such", {}))["code"] == -32601
    assert (await peer.send_raw('{"jsonrpc":"2.0","id":9,"method":'))["error"]["code"] == -32700
    assert (await peer.error("event.emit", {"sessionId": "nope", "event": {"type": "x"}}))["code"] == -32004
    assert await stored(r, namespace, sid) == before
    assert (await peer.call("session.get", {"sessionId": sid}))["session"]["seq"] == 1


async def test_read_only_token_cannot_write(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("reader", namespace, scope="sessions:read")) as peer:
        error = await peer.error("session.create", {})
        assert error["code"] == -32001 and error["data"] == {"scope": "sessions:write"}
        assert (await peer.call("session.list", {}))["sessions"] == []


async def test_a_client_over_its_rate_gets_32029_and_those_requests_do_nothing(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    import json

    import anyio

    async with running(make_settings(backend_urls, tmp_path, ws_rate_limit=5)) as daemon, \
            rpc(daemon.port, token("eager", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        for i in range(20):  # all in flight at once
            await peer.ws.send(json.dumps({"jsonrpc": "2.0", "id": 100 + i, "method": "event.emit",
                                           "params": {"sessionId": sid, "event": {"type": "modified"}}}))
        replies = [await peer.reply(100 + i) for i in range(20)]
        done = [r for r in replies if "result" in r]
        limited = [r["error"] for r in replies if "error" in r]
        assert len(done) + len(limited) == 20 and 1 <= len(done) <= 6 and limited
        assert all(e["code"] == -32029 and e["data"]["retryAfterMs"] > 0 for e in limited)
        assert [r["result"]["seq"] for r in done] == list(range(1, len(done) + 1))
        await anyio.sleep(0.5)
        assert (await peer.call("session.get", {"sessionId": sid}))["session"]["seq"] == len(done)
