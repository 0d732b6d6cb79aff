"""SessionManager over the real embedded Redis: atomic seq, dedupe, TTLs, namespaces, views."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.server.daemon import Daemon
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import EventIn
from memento_sessions.settings import Settings
from tests.helpers import token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


def who(agent: str, namespace: str) -> Identity:
    return Identity(agent, namespace, frozenset({"sessions:read", "sessions:write"}))


async def test_fifty_agents_emitting_concurrently_get_seq_1_to_10000(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("lead", namespace)) as lead:
        sid = (await lead.call("session.create", {}))["sessionId"]
    seqs: list[int] = []

    async def agent(n: int) -> None:
        async with rpc(daemon.port, token(f"agent-{n}", namespace)) as peer:
            await peer.call("session.join", {"sessionId": sid})
            for i in range(200):
                done = await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified",
                                                                                   "id": f"a{n}-e{i}"}})
                assert done["duplicate"] is False
                seqs.append(done["seq"])

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(agent, n)
    assert sorted(seqs) == list(range(1, 10_001))

    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    skeys = keys.session_keys(namespace, sid)
    assert await r.zcard(skeys.events) == 10_000
    stored: list[Any] = await r.zrange(skeys.events, 0, -1, withscores=True)
    assert [int(score) for _, score in stored] == list(range(1, 10_001))

    async with rpc(daemon.port, token("agent-7", namespace)) as peer:
        replay = await peer.call("event.emit", {"sessionId": sid, "event": {"type": "broke", "id": "a7-e3"}})
        original = [s for m, s in stored if '"id":"a7-e3"' in m]
    assert replay == {"seq": int(original[0]), "duplicate": True}
    assert await r.zcard(skeys.events) == 10_000
    assert await r.hget(skeys.session, "seq") == "10000"
    assert await r.hget(skeys.session, "state") == "working", "a duplicate must not change the state"
    await r.aclose()


async def test_every_key_carries_a_ttl_reset_by_activity_and_expires_alone(settings: Settings,
                                                                           namespace: str) -> None:
    r = aioredis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    manager = SessionManager(r, settings)
    await manager.start()
    alice = who("alice", namespace)
    sid = (await manager.create(alice, entity_ids=["fn:a"], ttl=2))["sessionId"]
    skeys = keys.session_keys(namespace, sid)
    await manager.emit(alice, sid, EventIn(type="modified", id="x1"))
    for key in skeys.all():
        assert 0 < await r.pttl(key) <= 2000, key
    await anyio.sleep(1.2)
    await manager.join(who("bob", namespace), sid)
    assert await r.pttl(skeys.session) > 1500, "join is activity: the TTL starts again"
    await anyio.sleep(1.2)
    assert await r.exists(skeys.session) == 1, "alive 2.4 s after creation thanks to activity at 1.2 s"
    await anyio.sleep(1.5)
    assert await r.exists(*skeys.all()) == 0, "no activity for its TTL: Redis expired every key"
    r2 = aioredis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    settings_ttl = SessionManager(r2, settings)
    other = (await settings_ttl.create(alice))["sessionId"]
    for key in [*keys.session_keys(namespace, other).all()[:1], keys.session_keys(namespace, other).agents]:
        assert 0 < await r.ttl(key) <= settings.session_ttl
    await r.aclose()
    await r2.aclose()


async def test_a_full_batch_stores_each_id_once_in_order_with_replays_of_stored_and_earlier_ids(
        settings: Settings, namespace: str) -> None:
    """A batch of 500 (the Function writes its ids in chunks): 100 replays of ids stored by an earlier batch,
    100 repeats of ids earlier in the same batch, 100 events without an id, 200 new ids."""
    r = aioredis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    manager = SessionManager(r, settings)
    await manager.start()
    alice = who("alice", namespace)
    sid = (await manager.create(alice))["sessionId"]
    first = await manager.emit_batch(alice, sid, [EventIn(type="modified", id=f"old-{i}") for i in range(100)])
    assert [item.seq for item in first] == list(range(1, 101))
    batch = []
    for i in range(100):
        batch += [EventIn(type="modified", id=f"new-{i}"), EventIn(type="modified", id=f"old-{i}"),
                  EventIn(type="modified", id=f"new-{i}"), EventIn(type="m"),
                  EventIn(type="broke" if i == 99 else "modified", id=f"more-{i}")]
    done = await manager.emit_batch(alice, sid, batch)
    seqs, fresh = [item.seq for item in done], iter(range(101, 401))
    expected = []
    for i in range(100):
        new = next(fresh)
        expected += [new, i + 1, new, next(fresh), next(fresh)]
    assert seqs == expected
    assert [item.duplicate for item in done] == [False, True, True, False, False] * 100
    skeys = keys.session_keys(namespace, sid)
    stored: list[Any] = await r.zrange(skeys.events, 0, -1, withscores=True)
    assert [int(score) for _, score in stored] == list(range(1, 401))
    assert all(member.startswith(f'{{"seq":{int(score)},"type":') for member, score in stored)
    assert [json_id(member) for member, _ in stored[100:105]] == ["new-0", None, "more-0", "new-1", None]
    ids = await r.hgetall(skeys.ids)
    assert len(ids) == 300 and ids["new-99"] == str(expected[-5]) and ids["old-0"] == "1"
    session = await r.hgetall(skeys.session)
    assert (session["seq"], session["state"]) == ("400", "broken"), "the batch's last state change wins"
    again = await manager.emit_batch(alice, sid, batch)
    with_ids = [n for n in range(500) if n % 5 != 3]
    assert [again[n].seq for n in with_ids] == [expected[n] for n in with_ids]
    assert all(again[n].duplicate for n in with_ids)
    assert await r.zcard(skeys.events) == 500, "the id-less events of a replayed batch are stored again"
    await r.aclose()


def json_id(member: str) -> str | None:
    """The client id of a stored event, if it has one."""
    value = json.loads(member).get("id")
    return None if value is None else str(value)


async def test_namespaces_are_isolated(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace + "x")) as b:
        sid = (await a.call("session.create", {"labels": {"team": "red"}}))["sessionId"]
        for method, params in [("session.get", {"sessionId": sid}), ("session.join", {"sessionId": sid}),
                               ("event.emit", {"sessionId": sid, "event": {"type": "modified"}})]:
            assert (await b.error(method, params))["code"] == -32004
        assert (await b.call("session.list", {}))["sessions"] == []
        assert [s["sessionId"] for s in (await a.call("session.list", {}))["sessions"]] == [sid]
        assert (await a.call("session.get", {"sessionId": sid}))["session"]["seq"] == 0


async def test_create_with_entities_get_and_condensed_view(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as a, rpc(daemon.port, token("bob", namespace)) as b:
        created = await a.call("session.create", {"entityIds": ["fn:parse", "spec:io"], "sessionId": "fix-42"})
        assert (created["sessionId"], created["seq"], created["agentIds"], created["state"]) == \
            ("fix-42", 1, ["alice"], "working")
        assert (await a.error("session.create", {"sessionId": "fix-42"}))["code"] == -32009
        joined = await b.call("session.join", {"sessionId": "fix-42"})
        assert joined == {"sessionId": "fix-42", "agentIds": ["alice", "bob"], "state": "working", "seq": 1}
        await b.call("event.emitBatch", {"sessionId": "fix-42", "events": [
            {"type": "modified", "changeInfo": {"entityIds": ["fn:parse"]}, "impact": {"perfDelta": -2.5}},
            {"type": "broke", "impact": {"severity": "high", "testsFailed": ["t1"], "perfDelta": 1}},
            {"type": "test_pass", "stateTransition": {"from": "broken", "to": "working", "verifiedBy": "test"}},
        ]})
        full = await a.call("session.get", {"sessionId": "fix-42", "since": 2, "limit": 2})
        assert [e["seq"] for e in full["events"]] == [3, 4]
        assert full["events"][0]["actor"] == "bob" and full["events"][0]["sessionId"] == "fix-42"
        view = await a.call("session.get", {"sessionId": "fix-42", "condensed": True})
        assert view["counts"] == {"start": 1, "modified": 1, "broke": 1, "test_pass": 1}
        assert view["entities"] == {"fn:parse": 2, "spec:io": 1}
        assert view["transitions"] == [{"seq": 3, "from": "working", "to": "broken", "actor": "bob"},
                                       {"seq": 4, "from": "broken", "to": "working", "actor": "bob"}]
        assert view["perfDelta"] == -1.5 and view["session"]["seq"] == 4
        await b.call("session.leave", {"sessionId": "fix-42"})
        assert (await a.call("session.get", {"sessionId": "fix-42"}))["session"]["agentIds"] == ["alice"]


async def test_list_is_newest_first_and_filters(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as a, rpc(daemon.port, token("bob", namespace)) as b:
        first = (await a.call("session.create", {}))["sessionId"]
        await anyio.sleep(0.005)
        second = (await b.call("session.create", {}))["sessionId"]
        await anyio.sleep(0.005)
        third = (await a.call("session.create", {}))["sessionId"]
        await a.call("event.emit", {"sessionId": third, "event": {"type": "broke"}})
        listed = (await a.call("session.list", {}))["sessions"]
        assert [s["sessionId"] for s in listed] == [third, second, first]
        assert [s["sessionId"] for s in (await a.call("session.list", {"state": "broken"}))["sessions"]] == [third]
        assert [s["sessionId"] for s in (await a.call("session.list", {"agentId": "bob"}))["sessions"]] == [second]
        assert len((await a.call("session.list", {"limit": 1}))["sessions"]) == 1


@pytest.mark.parametrize("reply", [
    "LOADING Redis is loading the dataset in memory", "BUSY Redis is busy running a script",
    "MASTERDOWN Link with MASTER is down", "TRYAGAIN Multiple keys request during rehashing"])
def test_a_redis_that_cannot_serve_yet_reads_as_unavailable_not_as_an_internal_error(reply: str) -> None:
    from redis.exceptions import BusyLoadingError

    from memento_sessions.backends import UNAVAILABLE
    from memento_sessions.sessions.functions import translate

    error = translate(reply)
    assert isinstance(error, BusyLoadingError) and isinstance(error, UNAVAILABLE), "answered -32050, not -32603"
    assert not isinstance(translate("ERR something else"), UNAVAILABLE)
