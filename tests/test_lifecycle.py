"""The lifecycle: suspend into Postgres and resume with the same seqs and epoch, fork, onIdle, status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.backends import Backends
from memento_sessions.endpoints import Endpoints
from memento_sessions.lifecycle.methods import LifecycleService
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.settings import Settings
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


async def stored_rows(dsn: str, namespace: str) -> list[tuple[str, int, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT session_id, seq, status FROM suspended_sessions WHERE namespace = $1 "
                                "ORDER BY session_id", namespace)
    finally:
        await conn.close()
    return [(row[0], row[1], row[2]) for row in rows]


async def test_suspend_and_resume_keep_seqs_epoch_and_every_event_once(daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with rpc(daemon.port, token("alice", namespace)) as peer, rpc(daemon.port, token("bob", namespace)) as sub:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified", "id": f"e{i}"}
                                                                          for i in range(9)]})
        before = await peer.call("session.get", {"sessionId": sid})
        subscribed = await sub.call("session.subscribe", {"sessionId": sid, "since": 10})
        assert subscribed["recovered"] is True
        done = await peer.call("session.suspend", {"sessionId": sid})
        assert done == {"sessionId": sid, "status": "suspended", "seq": 10, "epoch": before["session"]["epoch"]}
        assert await r.exists(*keys.session_keys(namespace, sid).all()) == 0
        assert await stored_rows(daemon.settings.postgres_dsn or "", namespace) == [(sid, 10, "suspended")]
        again = await peer.call("session.suspend", {"sessionId": sid})
        assert again["status"] == "suspended"  # suspending twice is harmless
        listed = await peer.call("session.list", {"status": "suspended"})
        assert [s["sessionId"] for s in listed["sessions"]] == [sid]
        assert (await peer.error("event.emit", {"sessionId": sid, "event": {"type": "x"}}))["code"] == -32004
        resumed = await peer.call("session.resume", {"sessionId": sid})
        assert resumed == {"sessionId": sid, "status": "active", "seq": 10, "epoch": before["session"]["epoch"]}
        after = await peer.call("session.get", {"sessionId": sid})
        assert after["events"] == before["events"] and after["session"]["epoch"] == before["session"]["epoch"]
        assert await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "e3"}}) == {
            "seq": 5, "duplicate": True}  # the idempotency ids came back too (seq 1 is the start event)
        assert await peer.call("event.emit", {"sessionId": sid, "event": {"type": "broke"}}) == {
            "seq": 11, "duplicate": False}
        note = await sub.notification("session.event")
        assert note["params"]["seq"] == 11 and note["params"]["epoch"] == before["session"]["epoch"]
        methods = [n["method"] for n in sub.notifications]
        assert "session.suspended" in methods and "session.resumed" in methods
        # seq 11 was taken above: no other event arrived, none twice (the subscriber was at seq 10 already)
        assert [n["params"]["seq"] for n in sub.notifications if n["method"] == "session.event"] == []
        assert await stored_rows(daemon.settings.postgres_dsn or "", namespace) == []
        assert (await peer.call("session.list", {"status": "active"}))["sessions"][0]["sessionId"] == sid
    await r.aclose()


async def test_resume_of_an_active_session_is_a_conflict_and_writes_nothing(daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        skeys = keys.session_keys(namespace, sid)
        before = await r.hgetall(skeys.session)
        error = await peer.error("session.resume", {"sessionId": sid})
        assert error["code"] == -32009 and error["data"] == {"reason": "active"}
        missing = await peer.error("session.resume", {"sessionId": "nope"})
        assert missing["code"] == -32004
        assert await r.hgetall(skeys.session) == before and await r.zcard(skeys.events) == 1
    await r.aclose()


async def test_two_daemons_suspend_and_resume_once(settings: Settings, backends: Backends, namespace: str) -> None:
    managers = [SessionManager(backends.redis, settings) for _ in range(2)]
    for manager in managers:
        await manager.start()
    services = [LifecycleService(manager, backends) for manager in managers]
    # Opened before the race: two first calls of Postgres.pool() at once each open a pool (one leaks).
    await backends.postgres.pool()
    from memento_sessions.auth import Identity
    alice = Identity("alice", namespace, frozenset({"sessions:read", "sessions:write"}))
    sid = (await managers[0].create(alice, entity_ids=["fn:a"]))["sessionId"]
    results: list[dict[str, object]] = []

    async def suspend(service: LifecycleService) -> None:
        results.append(await service.lifecycle.suspend(namespace, sid))

    async with anyio.create_task_group() as tg:
        for service in services:
            tg.start_soon(suspend, service)
    assert [r["status"] for r in results] == ["suspended", "suspended"]
    assert await stored_rows(settings.postgres_dsn or "", namespace) == [(sid, 1, "suspended")]
    results.clear()

    async def resume(service: LifecycleService) -> None:
        try:
            results.append(await service.lifecycle.resume(namespace, sid))
        except Exception as exc:  # the loser may find the row already gone: not found, nothing written
            results.append({"error": type(exc).__name__})

    async with anyio.create_task_group() as tg:
        for service in services:
            tg.start_soon(resume, service)
    assert {"sessionId": sid, "status": "active", "seq": 1, "epoch": results[0].get("epoch") or
            results[1].get("epoch")} in results
    assert await backends.redis.zcard(keys.session_keys(namespace, sid).events) == 1
    assert await stored_rows(settings.postgres_dsn or "", namespace) == []


async def test_fork_copies_events_up_to_at_seq_and_leaves_the_parent_alone(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "broke"}, {"type": "test_pass"},
                                                                          {"type": "modified"}]})
        parent = await peer.call("session.get", {"sessionId": sid})
        fork = await peer.call("session.fork", {"sessionId": sid, "atSeq": 2, "newSessionId": "fork-1"})
        assert fork["sessionId"] == "fork-1" and fork["seq"] == 2 and fork["state"] == "broken"
        assert fork["parentSessionId"] == sid and fork["forkedAtSeq"] == 2
        assert fork["epoch"] != parent["session"]["epoch"]
        forked = await peer.call("session.get", {"sessionId": "fork-1"})
        assert forked["events"] == parent["events"][:2]
        assert forked["session"]["parentSessionId"] == sid and forked["session"]["forkedAtSeq"] == 2
        assert await peer.call("event.emit", {"sessionId": "fork-1", "event": {"type": "x"}}) == {
            "seq": 3, "duplicate": False}
        unchanged = await peer.call("session.get", {"sessionId": sid})
        assert unchanged["events"] == parent["events"]
        for name in ("seq", "state", "epoch", "updatedAt", "agentIds"):
            assert unchanged["session"][name] == parent["session"][name], name
        beyond = await peer.error("session.fork", {"sessionId": sid, "atSeq": 9})
        assert beyond["code"] == -32602 and beyond["data"][0]["field"] == "atSeq"
        taken = await peer.error("session.fork", {"sessionId": sid, "atSeq": 1, "newSessionId": "fork-1"})
        assert taken["code"] == -32009
        await peer.call("session.suspend", {"sessionId": sid})
        from_suspended = await peer.call("session.fork", {"sessionId": sid, "atSeq": 4})
        assert from_suspended["seq"] == 4 and from_suspended["state"] == "working"
    async with rpc(daemon.port, token("eve", namespace + "x")) as other:
        hidden = await other.error("session.fork", {"sessionId": "fork-1", "atSeq": 1})
        assert hidden["code"] == -32004
        assert (await other.call("session.list", {}))["sessions"] == []


async def test_on_idle_suspend_moves_a_session_to_postgres_before_redis_expires_it(
        daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"], "onIdle": "suspend", "ttl": 60}))[
            "sessionId"]
        skeys = keys.session_keys(namespace, sid)
        assert 170_000 < await r.pttl(skeys.session) <= 180_000  # the TTL plus the margin to suspend it in
        assert (await peer.call("session.get", {"sessionId": sid}))["session"]["onIdle"] == "suspend"
        for key in skeys.all():
            await r.pexpire(key, 30_000)  # idle: well inside the margin
        assert daemon.services is not None
        service = LifecycleService(daemon.services.manager, daemon.services.backends)
        assert (await service.move())[0] >= 1
        assert await r.exists(skeys.session) == 0
        assert await stored_rows(daemon.settings.postgres_dsn or "", namespace) == [(sid, 1, "suspended")]
        bad = await peer.error("session.create", {"onIdle": "sleep"})
        assert bad["code"] == -32602 and bad["data"][0]["field"] == "onIdle"
    await r.aclose()


LIFECYCLE_TOOLS = {"get_session_at", "diff_session", "snapshot_session", "compact_session", "fork_session",
                   "suspend_session", "resume_session"}


async def test_the_lifecycle_tools_over_mcp(daemon: Daemon, namespace: str) -> None:
    from tests.test_mcp import failed, ok, over_http

    async with over_http(daemon.port, token("alice", namespace)) as mcp:
        listed = {tool.name for tool in (await mcp.list_tools()).tools}
        assert listed >= LIFECYCLE_TOOLS
        sid = ok(await mcp.call_tool("create_session", {"entityIds": ["fn:a"]}))["sessionId"]
        ok(await mcp.call_tool("emit_event", {"sessionId": sid, "event": {"type": "broke"}}))
        at = ok(await mcp.call_tool("get_session_at", {"sessionId": sid, "atSeq": 2}))
        assert at["session"]["state"] == "broken" and at["counts"] == {"start": 1, "broke": 1}
        diff = ok(await mcp.call_tool("diff_session", {"sessionId": sid, "fromSeq": 1, "toSeq": 2}))
        assert diff["stateFrom"] == "working" and diff["stateTo"] == "broken" and diff["events"] == 1
        text = failed(await mcp.call_tool("diff_session", {"sessionId": sid, "fromSeq": 2, "toSeq": 1}))
        assert text.endswith("invalid params (-32602); fromSeq: 2 is after toSeq 1")
        fork = ok(await mcp.call_tool("fork_session", {"sessionId": sid, "atSeq": 1}))
        assert fork["seq"] == 1 and fork["state"] == "working" and fork["parentSessionId"] == sid
        assert ok(await mcp.call_tool("suspend_session", {"sessionId": sid}))["status"] == "suspended"
        assert ok(await mcp.call_tool("resume_session", {"sessionId": sid}))["seq"] == 2
        text = failed(await mcp.call_tool("resume_session", {"sessionId": sid}))
        assert "the session is active, not suspended (-32009); reason: active" in text


async def test_list_by_status_refuses_a_bad_cursor_or_status(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        for params in ({"cursor": "nope"}, {"status": "suspended", "cursor": "nope"}, {"status": "sleeping"}):
            error = await peer.error("session.list", params)
            assert error["code"] == -32602 and error["data"][0]["field"] in ("cursor", "status"), params
        assert (await peer.call("session.list", {"status": "completed"}))["sessions"] == []


async def test_an_archive_pass_cut_off_by_postgres_is_logged_and_the_next_one_runs(
        settings: Settings, backends: Backends) -> None:
    """Postgres terminating the pass's connection mid-query (as a shutdown does) ends that pass, not the daemon's
    lifecycle loop (it used to end the whole daemon with ConnectionDoesNotExistError)."""
    manager = SessionManager(backends.redis, settings)
    await manager.start()
    service = LifecycleService(manager, backends)
    await service.suspended.migrate()
    holder = await asyncpg.connect(settings.postgres_dsn)
    try:
        async with holder.transaction(), anyio.create_task_group() as tg:
            await holder.execute("LOCK TABLE suspended_sessions IN ACCESS EXCLUSIVE MODE")
            tg.start_soon(service._guarded, service.archive)  # waits on the lock, inside ARCHIVE_OLD
            with anyio.fail_after(10):
                while not await holder.fetchval(WAITING_ON_THE_TABLE):
                    await anyio.sleep(0.05)
            assert await holder.fetchval(TERMINATE_WAITING) is True
        assert isinstance(await service.archive(), int)  # the next pass opens a new connection and runs
    finally:
        await holder.close()


WAITING_ON_THE_TABLE = ("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                        "AND wait_event_type = 'Lock' AND query ILIKE '%suspended_sessions%'")
TERMINATE_WAITING = ("SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                     "AND wait_event_type = 'Lock' AND query ILIKE '%suspended_sessions%'")


async def test_get_of_a_suspended_session_reads_it_from_postgres(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [
            {"type": {3: "broke", 10: "test_pass"}.get(i, "modified"), "changeInfo": {"entityIds": [f"fn:{i % 3}"]}}
            for i in range(11)]})
        await peer.call("session.checkpoint", {"sessionId": sid})  # compaction keeps what a checkpoint needs
        assert (await peer.call("session.compact", {"sessionId": sid, "beforeSeq": 4}))["compactedSeq"] == 4
        live = await peer.call("session.get", {"sessionId": sid})
        condensed = await peer.call("session.get", {"sessionId": sid, "condensed": True})
        assert condensed["counts"] == {"start": 1, "modified": 9, "broke": 1, "test_pass": 1}  # compacted ones too
        at6 = await peer.call("session.get", {"sessionId": sid, "atSeq": 6})
        await peer.call("session.suspend", {"sessionId": sid})
        got = await peer.call("session.get", {"sessionId": sid})
        assert got["session"]["status"] == "suspended"
        suspended_at = datetime.fromisoformat(got["session"]["suspendedAt"])
        archived_in = datetime.fromisoformat(got["session"]["expiresAt"]) - suspended_at
        assert abs(archived_in - timedelta(days=30)) < timedelta(milliseconds=1)  # its events go then
        assert got["session"]["seq"] == 12 and got["session"]["compactedSeq"] == 4 and "suspendedAt" in got["session"]
        assert got["events"] == live["events"] and [e["seq"] for e in got["events"]] == list(range(5, 13))
        assert got["snapshot"] == live["snapshot"] and got["snapshot"]["seq"] == 4  # below compactedSeq: no hole
        first = await peer.call("session.get", {"sessionId": sid, "since": 4, "limit": 5})
        assert [e["seq"] for e in first["events"]] == [5, 6, 7, 8, 9] and first["nextSince"] == 9
        assert "snapshot" not in first
        rest = await peer.call("session.get", {"sessionId": sid, "since": 9, "limit": 5})
        assert [e["seq"] for e in rest["events"]] == [10, 11, 12] and "nextSince" not in rest
        stored = await peer.call("session.get", {"sessionId": sid, "condensed": True})
        for name in ("counts", "entities", "transitions", "perfDelta", "state"):
            assert stored.get(name) == condensed.get(name), name
        stored_at6 = await peer.call("session.get", {"sessionId": sid, "atSeq": 6})
        assert {k: v for k, v in stored_at6.items() if k != "session"} == {
            k: v for k, v in at6.items() if k != "session"}
        assert stored_at6["session"]["state"] == at6["session"]["state"] == "broken"
        beyond = await peer.error("session.get", {"sessionId": sid, "atSeq": 13})
        assert beyond["code"] == -32602 and beyond["data"][0]["field"] == "atSeq"
        gone = await peer.error("session.get", {"sessionId": sid, "atSeq": 2})
        assert gone["code"] == -32009 and gone["data"]["reason"] == "compacted"  # no snapshot at or before 2
        listed = (await peer.call("session.list", {"status": "suspended"}))["sessions"]
        assert [(s["sessionId"], s["status"], s["seq"]) for s in listed] == [(sid, "suspended", 12)]
    async with rpc(daemon.port, token("eve", namespace + "x")) as other:
        assert (await other.error("session.get", {"sessionId": sid}))["code"] == -32004  # another namespace's


async def test_completed_sessions_outlive_redis_and_are_archived_after_the_retention(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, checkpoint_grace_ttl=2, archive_after_days=30)
    r = aioredis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as peer:
        assert daemon.services is not None
        # Two daemons' lifecycle passes over the same servers: each copies, one row results.
        services = [LifecycleService(daemon.services.manager, daemon.services.backends) for _ in range(2)]
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "broke"}, {"type": "test_pass"}]})
        idle = (await peer.call("session.create", {"entityIds": ["fn:b"]}))["sessionId"]
        await peer.call("session.suspend", {"sessionId": idle})
        await peer.call("session.checkpoint", {"sessionId": sid, "final": True})
        before = await peer.call("session.get", {"sessionId": sid})
        assert before["session"]["status"] == "completed"
        moved: list[tuple[int, int]] = []

        async def move(service: LifecycleService) -> None:
            moved.append(await service.move())

        async with anyio.create_task_group() as tg:
            for service in services:
                tg.start_soon(move, service)
        assert sum(kept for _, kept in moved) >= 1
        assert await stored_rows(settings.postgres_dsn or "", namespace) == sorted(
            [(sid, 3, "completed"), (idle, 1, "suspended")])
        assert (await services[0].keep_completed([(namespace, sid)])) == 0
        with anyio.fail_after(10):
            while await r.exists(keys.session_keys(namespace, sid).session):  # the grace TTL runs out
                await anyio.sleep(0.2)
        after = await peer.call("session.get", {"sessionId": sid})
        assert after["events"] == before["events"] and after["session"]["status"] == "completed"
        completed_at = datetime.fromisoformat(after["session"]["completedAt"])
        archived_in = datetime.fromisoformat(after["session"]["expiresAt"]) - completed_at
        assert abs(archived_in - timedelta(days=30)) < timedelta(milliseconds=1)
        assert after["session"]["lastCheckpoint"] == before["session"]["lastCheckpoint"]
        listed = (await peer.call("session.list", {"status": "completed"}))["sessions"]
        assert [(s["sessionId"], s["status"]) for s in listed] == [(sid, "completed")]
        for method in ("session.resume", "session.suspend"):
            error = await peer.error(method, {"sessionId": sid})
            assert error["code"] == -32009 and error["data"] == {"reason": "completed"}, method
        now = datetime.now(UTC)
        await services[0].archive(now + timedelta(days=29))
        assert await stored_rows(settings.postgres_dsn or "", namespace) == sorted(
            [(sid, 3, "completed"), (idle, 1, "suspended")])
        assert await services[0].archive(now + timedelta(days=31)) >= 2
        assert await services[1].archive(now + timedelta(days=31)) == 0  # once, whichever daemon runs it
        assert await stored_rows(settings.postgres_dsn or "", namespace) == sorted(
            [(sid, 3, "archived"), (idle, 1, "archived")])
        archived = await peer.call("session.get", {"sessionId": sid})
        assert archived["session"]["status"] == "archived" and archived["events"] == []
        assert archived["summary"]["counts"] == {"start": 1, "broke": 1, "test_pass": 1}
        assert archived["session"]["state"] == "completed" and archived["session"]["seq"] == 3
        error = await peer.error("session.get", {"sessionId": sid, "atSeq": 2})
        assert error["code"] == -32009 and error["data"] == {"reason": "archived"}
        listed = (await peer.call("session.list", {"status": "archived"}))["sessions"]
        assert sorted(s["sessionId"] for s in listed) == sorted([sid, idle])
        assert (await peer.call("session.list", {"status": "completed"}))["sessions"] == []
        error = await peer.error("session.resume", {"sessionId": idle})
        assert error["code"] == -32009 and error["data"] == {"reason": "archived"}
    await r.aclose()


async def test_a_fork_s_state_is_the_state_time_travel_gives_at_its_seq(daemon: Daemon, namespace: str) -> None:
    """The fork reads its state off the newest event that sets one, decoding only events that may (a
    transition, a broke/test_pass type, or one whose text merely looks like it, as `data` below)."""
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [
            {"type": "broke"}, {"type": "note", "stateTransition": {"from": "broken", "to": "working"}},
            {"type": "note", "data": {"type": "broke"}}, {"type": "modified"}, {"type": "test_pass"},
            {"type": "broke"}, {"type": "modified", "data": {"stateTransition": 1}}]})
        states = []
        for at in range(1, 9):
            fork = await peer.call("session.fork", {"sessionId": sid, "atSeq": at})
            states.append(fork["state"])
            assert fork["state"] == (await peer.call("session.get", {"sessionId": sid, "atSeq": at}))["session"][
                "state"], at
            assert (await peer.call("session.get", {"sessionId": fork["sessionId"]}))["session"]["seq"] == at
        assert states == ["working", "broken", "working", "working", "working", "working", "broken", "broken"]
