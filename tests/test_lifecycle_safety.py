"""The lifecycle under misuse and crashes: an id that Postgres holds is never taken by another session, a
stored row is never replaced by another epoch's, and a move cut short between its Redis and Postgres steps
leaves one authoritative copy, listed, with no seq reused in an epoch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.lifecycle.methods import LifecycleService
from memento_sessions.lifecycle.moves import Lifecycle
from memento_sessions.lifecycle.streams import Stager
from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


async def stored(dsn: str, namespace: str, session_id: str) -> tuple[str, int, str] | None:
    """(epoch, seq, status) of the stored row, if any."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow("SELECT epoch, seq, status FROM suspended_sessions WHERE namespace = $1 "
                                  "AND session_id = $2", namespace, session_id)
    finally:
        await conn.close()
    return (row[0], row[1], row[2]) if row else None


def service_of(daemon: Daemon) -> LifecycleService:
    assert daemon.services is not None
    return LifecycleService(daemon.services.manager, daemon.services.backends)


async def test_a_suspended_id_cannot_be_created_or_forked_onto(daemon: Daemon, namespace: str) -> None:
    dsn = daemon.settings.postgres_dsn or ""
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "kept", "entityIds": ["fn:a"]})
        await peer.call("event.emitBatch", {"sessionId": "kept", "events": [{"type": "modified", "id": f"e{i}"}
                                                                             for i in range(4)]})
        before = await peer.call("session.get", {"sessionId": "kept"})
        other = (await peer.call("session.create", {"entityIds": ["fn:b"]}))["sessionId"]
        suspended = await peer.call("session.suspend", {"sessionId": "kept"})
        row = await stored(dsn, namespace, "kept")
        for method, params in (("session.create", {"sessionId": "kept"}),
                               ("session.create", {"sessionId": "kept", "onIdle": "suspend"}),
                               ("session.fork", {"sessionId": other, "atSeq": 1, "newSessionId": "kept"})):
            error = await peer.error(method, params)
            assert error["code"] == -32009 and error["data"] == {"reason": "suspended"}, (method, params)
        assert await stored(dsn, namespace, "kept") == row == (suspended["epoch"], 5, "suspended")
        resumed = await peer.call("session.resume", {"sessionId": "kept"})
        assert resumed == {"sessionId": "kept", "status": "active", "seq": 5, "epoch": before["session"]["epoch"]}
        after = await peer.call("session.get", {"sessionId": "kept"})
        assert after["events"] == before["events"]


async def test_a_stored_row_is_never_replaced_by_another_epoch_s(daemon: Daemon, namespace: str) -> None:
    """A session that took a stored id anyway (its create raced the suspend) cannot overwrite the stored one."""
    dsn = daemon.settings.postgres_dsn or ""
    service = service_of(daemon)
    alice = Identity("alice", namespace, frozenset({"sessions:read", "sessions:write"}))
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "twice", "entityIds": ["fn:a"]})
        await peer.call("event.emit", {"sessionId": "twice", "event": {"type": "broke"}})
        first = await peer.call("session.suspend", {"sessionId": "twice"})
        await service.manager.create(alice, session_id="twice")  # straight to Redis, as a racing create would
        for method in ("session.suspend", "session.resume", "session.suspend"):
            error = await peer.error(method, {"sessionId": "twice"})
            assert error["code"] == -32009 and error["data"]["reason"] in ("suspended", "active"), method
            assert await stored(dsn, namespace, "twice") == (first["epoch"], 2, "suspended"), method


async def test_completed_and_archived_ids_are_refused_with_their_status(daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    service = service_of(daemon)
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "done", "entityIds": ["fn:a"]})
        await peer.call("session.checkpoint", {"sessionId": "done", "final": True})
        assert await service.keep_completed([(namespace, "done")]) == 1
        await r.delete(*keys.session_keys(namespace, "done").all())  # its grace TTL ran out
        error = await peer.error("session.create", {"sessionId": "done"})
        assert error["code"] == -32009 and error["data"] == {"reason": "completed"}
        assert await service.archive(datetime.now(UTC) + timedelta(days=400)) >= 1
        error = await peer.error("session.fork", {"sessionId": "done", "atSeq": 1, "newSessionId": "x"})
        assert error["code"] == -32004  # an archived session has no events to fork
        error = await peer.error("session.create", {"sessionId": "done"})
        assert error["code"] == -32009 and error["data"] == {"reason": "archived"}
    await r.aclose()


class Crash(Exception):
    """The daemon dying at this point: nothing after it runs."""


def no_removal(monkeypatch: pytest.MonkeyPatch, service: LifecycleService, point: str) -> None:
    call = service.lifecycle.manager.store.call

    async def patched(function: str, *args: object) -> object:
        if function == "ms_suspend":
            raise Crash(point)
        return await call(function, *args)  # type: ignore[arg-type]
    monkeypatch.setattr(service.lifecycle.manager.store, "call", patched)


def no_mark(monkeypatch: pytest.MonkeyPatch, service: LifecycleService, point: str) -> None:
    mark = service.lifecycle.store.mark

    async def patched(row: object, status: str, among: tuple[str, ...]) -> bool:
        if status == "suspended":
            raise Crash(point)
        return await mark(row, status, among)  # type: ignore[arg-type]
    monkeypatch.setattr(service.lifecycle.store, "mark", patched)


def half_staged(monkeypatch: pytest.MonkeyPatch, service: LifecycleService, point: str) -> None:
    events = Stager.events

    async def patched(self: Stager, members: list[str]) -> None:
        await events(self, members[:1])
        raise Crash(point)
    monkeypatch.setattr(Stager, "events", patched)


def no_delete(monkeypatch: pytest.MonkeyPatch, service: LifecycleService, point: str) -> None:
    async def patched(row: object) -> None:
        raise Crash(point)
    monkeypatch.setattr(service.lifecycle.store, "resumed", patched)


# Where the lifecycle stops dead (the daemon killed there), between two of its Redis and Postgres steps.
CRASHES = {"suspend: stored, before the Redis removal": no_removal,
           "suspend: removed from Redis, before the mark": no_mark,
           "resume: marked, half staged into Redis": half_staged,
           "resume: live in Redis, before the row's delete": no_delete}


SUSPEND_POINTS = ["suspend: stored, before the Redis removal", "suspend: removed from Redis, before the mark"]
RESUME_POINTS = ["resume: marked, half staged into Redis", "resume: live in Redis, before the row's delete"]


@pytest.mark.parametrize("point", SUSPEND_POINTS + RESUME_POINTS)
async def test_a_move_cut_short_leaves_one_listed_copy_and_never_reuses_a_seq(
        daemon: Daemon, namespace: str, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    seen: dict[tuple[str, int], object] = {}  # (epoch, seq) -> the event every reader saw there

    async def observe(peer: Any, sid: str) -> dict[str, Any]:
        got = await peer.call("session.get", {"sessionId": sid})
        for event in got["events"]:
            assert seen.setdefault((got["session"]["epoch"], event["seq"]), event) == event, "a seq reused"
        return dict(got)

    async def listed(peer: Any) -> list[str]:
        active = await peer.call("session.list", {"status": "active"})
        stored_ = await peer.call("session.list", {"status": "suspended"})
        return sorted(s["sessionId"] for s in active["sessions"] + stored_["sessions"])

    service = service_of(daemon)
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified", "data": {"n": i}}
                                                                          for i in range(4)]})
        first = await observe(peer, sid)
        if point in RESUME_POINTS:
            await peer.call("session.suspend", {"sessionId": sid})
        with monkeypatch.context() as patched:
            CRASHES[point](patched, service, point)
            with pytest.raises(Crash):
                if point in RESUME_POINTS:
                    await service.lifecycle.resume(namespace, sid)
                else:
                    await service.lifecycle.suspend(namespace, sid)
        assert await listed(peer) == [sid]  # listed once, wherever its authoritative copy is
        got = await observe(peer, sid)
        assert got["events"] == first["events"]
        if await r.exists(keys.session_keys(namespace, sid).session):
            # The live copy is the authority: it goes on, then expires without being suspended again.
            if point in SUSPEND_POINTS:
                again = await peer.error("session.resume", {"sessionId": sid})
                assert again["code"] == -32009 and again["data"] == {"reason": "active"}
            await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "broke", "data": {"n": i}}
                                                                              for i in range(3)]})
            assert len((await observe(peer, sid))["events"]) == 8
            await r.delete(*keys.session_keys(namespace, sid).all())
        resumed = await peer.call("session.resume", {"sessionId": sid})
        back = await observe(peer, sid)
        assert resumed["seq"] == back["session"]["seq"] == 5 and back["events"] == first["events"]
        assert resumed["epoch"] != first["session"]["epoch"]  # the stored copy may be behind: a new epoch
        emitted = await peer.call("event.emit", {"sessionId": sid, "event": {"type": "test_pass"}})
        assert emitted["seq"] == 6
        await observe(peer, sid)
        assert await listed(peer) == [sid]
        assert await stored(daemon.settings.postgres_dsn or "", namespace, sid) is None
    await r.aclose()


async def test_a_create_or_fork_racing_the_suspend_of_its_id_is_withdrawn(
        daemon: Daemon, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check before the write passed (the old session was still live then); the suspend completed
    before the write: the new session is removed again and the create or fork refused."""
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    dsn = daemon.settings.postgres_dsn or ""

    async def checked_too_early(self: Lifecycle, namespace: str, session_id: str) -> None:
        return None
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "raced", "entityIds": ["fn:a"]})
        other = (await peer.call("session.create", {"entityIds": ["fn:b"]}))["sessionId"]
        first = await peer.call("session.suspend", {"sessionId": "raced"})
        monkeypatch.setattr(Lifecycle, "refuse_stored", checked_too_early)
        for method, params in (("session.create", {"sessionId": "raced"}),
                               ("session.create", {"sessionId": "raced", "onIdle": "suspend"}),
                               ("session.fork", {"sessionId": other, "atSeq": 1, "newSessionId": "raced"})):
            error = await peer.error(method, params)
            assert error["code"] == -32009 and error["data"] == {"reason": "suspended"}, (method, params)
            assert await r.exists(*keys.session_keys(namespace, "raced").all()) == 0, method
            assert await stored(dsn, namespace, "raced") == (first["epoch"], 1, "suspended")
        listed = await peer.call("session.list", {"status": "active"})
        assert "raced" not in [s["sessionId"] for s in listed["sessions"]]
        resumed = await peer.call("session.resume", {"sessionId": "raced"})
        assert resumed["epoch"] == first["epoch"] and resumed["seq"] == 1
    await r.aclose()
