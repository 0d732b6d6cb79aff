"""Time travel and diff: `session.get {atSeq}` and `session.diff`, folded by the live view's reducer."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio

EVENTS = [
    {"type": "modified", "changeInfo": {"entityIds": ["fn:a"]}, "impact": {"perfDelta": 2.5}},
    {"type": "broke", "changeInfo": {"entityIds": ["fn:a", "fn:b"]}},
    {"type": "modified", "changeInfo": {"entityIds": ["fn:c"]}, "impact": {"perfDelta": -1.0}},
    {"type": "test_pass"},
]


async def test_get_at_seq_is_the_session_right_after_that_event(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as alice, rpc(daemon.port, token("bob", namespace)) as bob:
        sid = (await alice.call("session.create", {}))["sessionId"]
        await alice.call("event.emitBatch", {"sessionId": sid, "events": EVENTS[:2]})
        await bob.call("session.join", {"sessionId": sid})
        await bob.call("event.emitBatch", {"sessionId": sid, "events": EVENTS[2:]})
        at2 = await alice.call("session.get", {"sessionId": sid, "atSeq": 2})
        assert at2["atSeq"] == 2 and at2["session"]["seq"] == 2 and at2["session"]["state"] == "broken"
        assert at2["session"]["agentIds"] == ["alice"]
        assert at2["counts"] == {"modified": 1, "broke": 1} and at2["entities"] == {"fn:a": 2, "fn:b": 1}
        assert at2["perfDelta"] == 2.5 and at2["events"] == 2
        assert at2["transitions"] == [{"seq": 2, "from": "working", "to": "broken", "actor": "alice"}]
        at4 = await alice.call("session.get", {"sessionId": sid, "atSeq": 4})
        live = await alice.call("session.get", {"sessionId": sid, "condensed": True})
        for name in ("counts", "entities", "transitions", "perfDelta"):
            assert at4[name] == live[name], name  # the same reducer as the live condensed view
        assert at4["session"]["state"] == "working" and at4["session"]["agentIds"] == ["alice", "bob"]
        at0 = await alice.call("session.get", {"sessionId": sid, "atSeq": 0})
        assert at0["counts"] == {} and at0["session"]["state"] == "working"


async def test_at_seq_beyond_the_session_is_invalid_and_writes_nothing(daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": EVENTS})
        before = await r.hgetall(keys.session_keys(namespace, sid).session)
        error = await peer.error("session.get", {"sessionId": sid, "atSeq": 5})
        assert error["code"] == -32602
        assert error["data"] == [{"field": "atSeq", "message": "5 is beyond the session's seq 4"}]
        negative = await peer.error("session.get", {"sessionId": sid, "atSeq": -1})
        assert negative["code"] == -32602 and negative["data"][0]["field"] == "atSeq"
        assert await r.hgetall(keys.session_keys(namespace, sid).session) == before
        assert (await peer.call("session.get", {"sessionId": sid}))["session"]["seq"] == 4  # connection kept
    await r.aclose()


async def test_diff_between_two_seqs(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as alice, rpc(daemon.port, token("bob", namespace)) as bob:
        sid = (await alice.call("session.create", {}))["sessionId"]
        await alice.call("event.emitBatch", {"sessionId": sid, "events": EVENTS[:2]})
        await bob.call("session.join", {"sessionId": sid})
        await bob.call("event.emitBatch", {"sessionId": sid, "events": EVENTS[2:]})
        diff = await alice.call("session.diff", {"sessionId": sid, "fromSeq": 1, "toSeq": 4})
        assert diff == {"fromSeq": 1, "toSeq": 4, "stateFrom": "working", "stateTo": "working", "events": 3,
                        "byType": {"broke": 1, "modified": 1, "test_pass": 1},
                        "entitiesChanged": ["fn:a", "fn:b", "fn:c"], "agentsJoined": ["bob"], "agentsLeft": [],
                        "transitions": [{"seq": 2, "from": "working", "to": "broken", "actor": "alice"},
                                        {"seq": 4, "from": "broken", "to": "working", "actor": "bob"}],
                        "perfDelta": -1.0}
        empty = await alice.call("session.diff", {"sessionId": sid, "fromSeq": 2, "toSeq": 2})
        assert empty["events"] == 0 and empty["stateFrom"] == empty["stateTo"] == "broken"


async def test_diff_bad_ranges_are_invalid(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": EVENTS})
        reversed_ = await peer.error("session.diff", {"sessionId": sid, "fromSeq": 3, "toSeq": 1})
        assert reversed_["code"] == -32602
        assert reversed_["data"] == [{"field": "fromSeq", "message": "3 is after toSeq 1"}]
        past = await peer.error("session.diff", {"sessionId": sid, "fromSeq": 1, "toSeq": 9})
        assert past["data"] == [{"field": "toSeq", "message": "9 is beyond the session's seq 4"}]
    async with rpc(daemon.port, token("eve", namespace + "x")) as other:
        hidden = await other.error("session.diff", {"sessionId": sid, "fromSeq": 0, "toSeq": 1})
        assert hidden["code"] == -32004
