"""Snapshots and compaction: rehydration equals the full history's view, checkpoints keep what they need."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pydantic_core
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.endpoints import Endpoints
from memento_sessions.errors import Conflict
from memento_sessions.history.views import History, compaction_limit
from memento_sessions.server.daemon import running
from memento_sessions.sessions.condense import Condenser
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import EventIn
from memento_sessions.settings import Settings
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio
AGENTS = ["ann", "ben", "cy"]


def who(agent: str, namespace: str) -> Identity:
    return Identity(agent, namespace, frozenset({"sessions:read", "sessions:write"}))


def random_event(rng: random.Random) -> EventIn:
    kind = rng.choice(["modified", "modified", "broke", "test_pass", "handoff", f"custom.{rng.randint(0, 3)}"])
    body: dict[str, Any] = {"type": kind}
    if rng.random() < 0.7:
        body["changeInfo"] = {"entityIds": rng.sample(["fn:a", "fn:b", "fn:c", "fn:d", "cl:x"], rng.randint(1, 3))}
    if rng.random() < 0.4:
        body["impact"] = {"perfDelta": round(rng.uniform(-50, 50), 3)}
    if rng.random() < 0.15:
        body["stateTransition"] = {"to": rng.choice(["working", "broken"])}
    return EventIn.model_validate(body)


def expected(events: list[dict[str, Any]], seq: int) -> dict[str, Any]:
    folder = Condenser()
    folder.add(events[:seq])
    return {"state": folder.state, "agentIds": sorted(folder.actors), **folder.result()}


def seen(view: dict[str, Any]) -> dict[str, Any]:
    out = {"state": view["session"]["state"], "agentIds": view["session"]["agentIds"]}
    out.update({name: view[name] for name in ("counts", "entities", "transitions", "perfDelta")})
    if "truncated" in view:
        out["truncated"] = view["truncated"]
    return out


async def checkpointed(r: aioredis.Redis, namespace: str, sid: str) -> None:
    """As if a (working) checkpoint had just run: compaction may then go up to the current seq."""
    skeys = keys.session_keys(namespace, sid)
    seq = int(await r.hget(skeys.session, "seq") or 0)
    await r.hset(skeys.session, "lastCheckpoint", pydantic_core.to_json({"id": "cp", "seq": seq, "snapshotSeq": 0,
                                                                         "outcome": "working"}).decode())


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
async def test_rehydration_equals_the_full_history_at_every_seq(settings: Settings, namespace: str,
                                                               seed: int) -> None:
    rng = random.Random(seed)
    r = aioredis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    manager = SessionManager(r, settings)
    await manager.start()
    history = History(manager, postgres=False)
    sid = (await manager.create(who("ann", namespace)))["sessionId"]
    skeys = keys.session_keys(namespace, sid)
    total = rng.randint(60, 160)
    points, snaps = set(rng.sample(range(5, total), rng.randint(1, 4))), set(rng.sample(range(1, total), 3))
    full: list[dict[str, Any]] = []  # every event as stored, read before any compaction removes it
    for seq in range(1, total + 1):
        await manager.emit(who(rng.choice(AGENTS), namespace), sid, random_event(rng))
        full.append(pydantic_core.from_json(str((await r.zrangebyscore(skeys.events, seq, seq))[0])))
        if seq in snaps:
            assert (await history.snapshot(namespace, sid))["seq"] == seq
        if seq in points:
            await checkpointed(r, namespace, sid)
            before = rng.randint(max(seq - 4, 1), seq)
            done = await history.compact(namespace, sid, before)
            assert done["compactedSeq"] >= before
    compacted = int(await r.hget(skeys.session, "compactedSeq") or 0)
    members = await r.zrange(skeys.events, 0, -1)
    assert compacted >= min(points) - 4
    assert [pydantic_core.from_json(str(m))["seq"] for m in members] == list(range(compacted + 1, total + 1))
    kept = {int(s) for s in (await r.hget(skeys.ids, "~snaps") or "").split()}
    for seq in range(total + 1):
        if 0 < seq < compacted and seq not in kept:  # seq 0 is the empty session, always known
            with pytest.raises(Conflict) as caught:
                await history.get_at(namespace, sid, seq)
            assert caught.value.data == {"reason": "compacted", "compactedSeq": compacted}
            continue
        assert seen(await history.get_at(namespace, sid, seq)) == expected(full, seq), seq
    await r.aclose()


def test_compaction_stops_where_a_checkpoint_still_needs_events() -> None:
    last = {"seq": 900, "snapshotSeq": 400, "outcome": "broken"}
    assert compaction_limit({"state": "working", "lastCheckpoint": last}, postgres=True) == 900
    assert compaction_limit({"state": "broken", "lastCheckpoint": last}, postgres=True) == 400
    assert compaction_limit({"state": "broken", "lastCheckpoint": last}, postgres=False) == 900
    assert compaction_limit({"state": "working", "lastCheckpoint": None}, postgres=True) == 0


async def test_get_below_the_compacted_seq_returns_the_snapshot_and_the_rest(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, checkpoint_every=100_000, compact_keep=5)
    r = aioredis.Redis.from_url(backend_urls.redis_url, decode_responses=True)
    async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        batch = [{"type": "modified", "changeInfo": {"entityIds": [f"fn:{i}"]}} for i in range(20)]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": batch})
        await checkpointed(r, namespace, sid)
        done = await peer.call("session.compact", {"sessionId": sid})
        assert done["compactedSeq"] == 15 and done["removed"] == 15 and done["snapshotId"] == "snap-15"
        page = await peer.call("session.get", {"sessionId": sid, "since": 3})
        assert [e["seq"] for e in page["events"]] == [16, 17, 18, 19, 20]
        assert page["snapshot"]["seq"] == 15 and page["snapshot"]["counts"] == {"modified": 15}
        assert page["session"]["compactedSeq"] == 15
        assert "snapshot" not in await peer.call("session.get", {"sessionId": sid, "since": 15})
        # A subscriber resuming below the compacted seq is told so, gets the snapshot, then what is stored.
        sub = await peer.call("session.subscribe", {"sessionId": sid, "since": 3})
        assert sub["recovered"] is False and sub["seq"] == 20 and sub["snapshot"]["seq"] == 15
        assert sub["snapshot"]["counts"] == {"modified": 15}
        replayed = [(await peer.notification("session.event"))["params"]["seq"] for _ in range(5)]
        assert replayed == [16, 17, 18, 19, 20]
        await peer.call("session.unsubscribe", {"sessionId": sid})
        whole = await peer.call("session.subscribe", {"sessionId": sid, "since": 16})
        assert whole["recovered"] is True and "snapshot" not in whole
        past = await peer.error("session.compact", {"sessionId": sid, "beforeSeq": 21})
        assert past["code"] == -32602 and past["data"] == [{"field": "beforeSeq",
                                                            "message": "21 is beyond the session's seq 20"}]
        assert await r.zcard(keys.session_keys(namespace, sid).events) == 5
    await r.aclose()


async def test_a_full_session_is_compacted_automatically_or_refused_when_that_is_off(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    r = aioredis.Redis.from_url(backend_urls.redis_url, decode_responses=True)
    for auto in (True, False):
        settings = make_settings(backend_urls, tmp_path, session_max_events=20, auto_compact=auto,
                                 checkpoint_every=100_000)
        async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as peer:
            sid = (await peer.call("session.create", {}))["sessionId"]
            await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified"}] * 20})
            await checkpointed(r, namespace, sid)
            skeys = keys.session_keys(namespace, sid)
            if auto:
                assert await peer.call("event.emit", {"sessionId": sid, "event": {"type": "broke"}}) == {
                    "seq": 21, "duplicate": False}
                assert await r.hget(skeys.session, "compactedSeq") == "10"
                assert await r.zcard(skeys.events) == 11
            else:
                error = await peer.error("event.emit", {"sessionId": sid, "event": {"type": "broke"}})
                assert error["code"] == -32009 and error["data"] == {"reason": "session_full"}
                assert await r.zcard(skeys.events) == 20 and await r.hget(skeys.session, "compactedSeq") is None
    await r.aclose()
