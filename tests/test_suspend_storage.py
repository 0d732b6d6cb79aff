"""Suspended sessions of any size within the limits: stored in chunks (no value near Postgres's 256 MB
jsonb ceiling), moved a chunk at a time (the daemon's memory per move bounded by a setting, not by the
session), and one session's failed idle suspend neither loses it nor stops the others'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis
import structlog

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.lifecycle.fork import fork
from memento_sessions.lifecycle.methods import GetAtParams, LifecycleService
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.sessions.manager import IDLE_MARGIN
from tests.helpers import SECRET, falkordb_url, make_settings, sample, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio

CHUNK = 64 * 1024  # MEMENTO_SUSPEND_CHUNK_BYTES in these tests (its floor)
EVENT_BYTES = 8000


@pytest.fixture
async def small_chunks(backend_urls: Endpoints, tmp_path: Path) -> AsyncIterator[Daemon]:
    # No checkpoints: their background work would count in the memory measured here.
    async with running(make_settings(backend_urls, tmp_path, suspend_chunk_bytes=CHUNK,
                                     checkpoint_every=100_000)) as daemon:
        yield daemon


def service_of(daemon: Daemon) -> LifecycleService:
    assert daemon.services is not None
    return LifecycleService(daemon.services.manager, daemon.services.backends)


async def fill(peer: Any, sid: str, count: int) -> None:
    """`count` events of about EVENT_BYTES each after the start event, 25 per batch."""
    for first in range(0, count, 25):
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [
            {"type": "modified", "id": f"e{n}", "data": {"n": n, "blob": f"{n:06d}" * (EVENT_BYTES // 6)}}
            for n in range(first, min(first + 25, count))]})


async def all_events(peer: Any, sid: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    since = 0
    while True:
        got = await peer.call("session.get", {"sessionId": sid, "since": since})
        events += got["events"]
        if "nextSince" not in got:
            return events
        since = got["nextSince"]


async def chunk_rows(dsn: str, namespace: str, session_id: str) -> list[tuple[str, int]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT kind, octet_length(body) FROM suspended_chunks WHERE namespace = $1 "
                                "AND session_id = $2 ORDER BY kind, part", namespace, session_id)
        inline = await conn.fetchval("SELECT coalesce(pg_column_size(events), 0) + pg_column_size(ids) FROM "
                                     "suspended_sessions WHERE namespace = $1 AND session_id = $2",
                                     namespace, session_id)
    finally:
        await conn.close()
    assert inline is None or inline < 1024, "the row itself holds no events"
    return [(row[0], row[1]) for row in rows]


async def test_a_session_many_chunks_large_is_stored_in_chunks_and_comes_back_whole(
        small_chunks: Daemon, namespace: str) -> None:
    daemon = small_chunks
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await fill(peer, sid, 300)  # ~2.4 MB: 36 times the chunk size
        before = await all_events(peer, sid)
        assert len(before) == 301
        await peer.call("session.suspend", {"sessionId": sid})
        rows = await chunk_rows(daemon.settings.postgres_dsn or "", namespace, sid)
        event_chunks = [size for kind, size in rows if kind == "e"]
        assert len(event_chunks) >= 300 * EVENT_BYTES // (CHUNK + 2 * EVENT_BYTES)
        assert max(event_chunks) <= CHUNK + 2 * EVENT_BYTES  # a chunk stops at the first event past the bound
        assert await all_events(peer, sid) == before  # paged from the chunks while suspended
        page = await peer.call("session.get", {"sessionId": sid, "since": 150, "limit": 3})
        assert [e["seq"] for e in page["events"]] == [151, 152, 153] and page["nextSince"] == 153
        await peer.call("session.resume", {"sessionId": sid})
        assert await all_events(peer, sid) == before
        assert await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "e7"}}) == {
            "seq": 9, "duplicate": True}  # the client ids came back too
        assert await chunk_rows(daemon.settings.postgres_dsn or "", namespace, sid) == []


async def test_one_failed_idle_suspend_keeps_its_session_and_the_others_are_suspended(
        daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    service = service_of(daemon)
    assert daemon.services is not None
    manager = daemon.services.manager
    broken_ns, broken = f"{namespace}-0", "broken"
    await manager.create(Identity("alice", broken_ns, frozenset()), session_id=broken, ttl=60, on_idle="suspend")
    bkeys = keys.session_keys(broken_ns, broken)
    await r.delete(bkeys.events)
    await r.set(bkeys.events, "not a sorted set", px=30_000)  # reading its events fails (WRONGTYPE)
    small = []
    for i in range(8):
        who = Identity("alice", f"{namespace}-{i % 6}", frozenset())
        small.append((who.namespace, (await manager.create(who, entity_ids=["fn:a"], ttl=60,
                                                           on_idle="suspend"))["sessionId"]))
    for ns, sid in [(broken_ns, broken), *small]:
        for key in keys.session_keys(ns, sid).all():
            await r.pexpire(key, 30_000)  # idle: well inside the margin
    done, done_broken = [(await manager.create(Identity("alice", broken_ns, frozenset())))["sessionId"]
                         for _ in range(2)]
    for sid in (done_broken, done):  # completed: the pass copies them to Postgres, the first one fails
        await r.hset(keys.session_keys(broken_ns, sid).session, "state", "completed")
    await r.set(keys.session_keys(broken_ns, done_broken).events, "not a sorted set", px=30_000)
    failed_before = sample("memento_lifecycle_total", {"action": "suspend_failed"})
    with structlog.testing.capture_logs() as logs:
        await service.move()  # (the daemon's own pass may run too: the outcome is the same)
    assert (await service.suspended.get(broken_ns, done)) is not None
    assert (await service.suspended.get(broken_ns, done_broken)) is None
    for ns, sid in small:
        assert not await r.exists(keys.session_keys(ns, sid).session), sid
        assert (await service.suspended.get(ns, sid)) is not None
    assert await r.exists(bkeys.session)
    assert await r.pttl(bkeys.session) > (IDLE_MARGIN - 5) * 1000  # not left to expire before the next pass
    assert sample("memento_lifecycle_total", {"action": "suspend_failed"}) >= failed_before + 2
    failures = [entry for entry in logs if entry["event"].startswith("moving the session to Postgres failed")]
    assert {entry["sessionId"] for entry in failures} == {broken, done_broken}
    assert all("WRONGTYPE" in entry["error"] for entry in failures)
    for sid in (broken, done_broken):  # leave no broken session to later tests' daemons
        await r.delete(*keys.session_keys(broken_ns, sid).all())
    assert not any("exc_info" in entry or entry["log_level"] in ("error", "critical") for entry in logs)
    await r.aclose()


async def peak_growth(work: Callable[[], Awaitable[object]]) -> int:
    """The peak of Python memory allocated while `work` runs, over what was allocated before it."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        await work()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


async def test_memory_per_move_is_bounded_by_the_chunk_size_not_the_session(
        small_chunks: Daemon, namespace: str) -> None:
    daemon = small_chunks
    service = service_of(daemon)
    lifecycle = service.lifecycle
    alice = Identity("alice", namespace, frozenset({"sessions:read", "sessions:write"}))
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await fill(peer, sid, 500)  # ~4 MB: more than 60 chunks
        bound = 16 * CHUNK  # 1 MB: a quarter of the session
        tiny = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        warm = await peak_growth(lambda: fork(lifecycle, alice, tiny, 1, None))  # first-call costs, once
        assert warm < bound
        # The daemon's other tasks in this process (heartbeats, other tests' daemons) allocate too: the fork,
        # which can be repeated, is taken at the least of three (one fork of a full suite's run saw 1.5 MB).
        forks = [await peak_growth(lambda: fork(lifecycle, alice, sid, 501, None)) for _ in range(3)]
        grown = {"fork": min(forks),
                 "suspend": await peak_growth(lambda: lifecycle.suspend(namespace, sid))}

        async def stored_page() -> object:  # session.get {since, limit} of the suspended session
            row = await service.suspended.get(namespace, sid)
            assert row is not None
            return await service.get_stored(row, GetAtParams(sessionId=sid, since=400, limit=5))
        grown["stored page"] = await peak_growth(stored_page)
        grown["fork of the stored"] = await peak_growth(lambda: fork(lifecycle, alice, sid, 300, None))
        grown["resume"] = await peak_growth(lambda: lifecycle.resume(namespace, sid))
        print({name: f"{size / 1e6:.2f} MB" for name, size in grown.items()})
        assert all(size < bound for size in grown.values()), grown
        assert len(await all_events(peer, sid)) == 501


MB = 1024 * 1024
DEFAULT_CHUNK = 4 * MB  # MEMENTO_SUSPEND_CHUNK_BYTES's default


@pytest.fixture
def daemon_process(backend_urls: Endpoints, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A `serve` process of its own on the tests' servers, default chunks, no checkpoints: (port, pid)."""
    port = free_port()
    env = {**os.environ, "MEMENTO_REDIS_URL": backend_urls.redis_url,
           "MEMENTO_POSTGRES_DSN": backend_urls.postgres_dsn or "", "MEMENTO_FALKORDB_URL": falkordb_url(backend_urls)
           or "", "MEMENTO_AUTH_SECRET": SECRET, "MEMENTO_PORT": str(port), "MEMENTO_DATA_DIR": str(tmp_path / "d"),
           "MEMENTO_LOG_LEVEL": "warning", "MEMENTO_CHECKPOINT_EVERY": "100000"}
    proc = subprocess.Popen([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env)
    try:
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(15)


def status_kb(pid: int) -> dict[str, int]:
    """The kB lines of /proc/<pid>/status (VmRSS, VmHWM), as numbers."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {name: int(value.split()[0]) for name, _, value in (line.partition(":") for line in lines)
            if value.strip().endswith(" kB")}


def reset_peak(pid: int) -> None:
    """The process's peak RSS (VmHWM) starts again from its RSS now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def rss_growth(pid: int, work: Awaitable[object]) -> float:
    """MB the process's peak RSS (VmHWM, reset first) rose above its RSS before, during `work`."""
    before = status_kb(pid)["VmRSS"]
    reset_peak(pid)
    await work
    return (status_kb(pid)["VmHWM"] - before) / 1024


async def test_a_resume_of_many_default_chunks_grows_the_daemon_by_a_few_chunks_not_the_session(
        daemon_process: tuple[int, int], namespace: str) -> None:
    """RSS of a daemon process, as the bench weighs it: the driver's and the allocator's buffers count too,
    which tracemalloc does not see. A ~40 MB session is ten chunks; its resume holds a chunk or two."""
    port, pid = daemon_process
    with anyio.fail_after(60):
        while True:
            try:
                await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                break
            except OSError:
                await anyio.sleep(0.1)
    async with rpc(port, token("alice", namespace)) as peer:
        warm = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await peer.call("session.suspend", {"sessionId": warm})
        await peer.call("session.resume", {"sessionId": warm})  # first-call costs, once
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        for first in range(0, 2700, 25):  # 2,700 events of 15 kB
            await peer.call("event.emitBatch", {"sessionId": sid, "events": [
                {"type": "modified", "id": f"e{n}", "data": {"blob": f"{n:06d}" * 2500}}
                for n in range(first, first + 25)]})
        await peer.call("session.suspend", {"sessionId": sid})
        resumed: dict[str, Any] = {}

        async def resume() -> None:
            resumed.update(await peer.call("session.resume", {"sessionId": sid}))
        grown = await rss_growth(pid, resume())
        print(f"resume of a ~40 MB session grew the daemon by {grown:.1f} MB")
        assert grown < 3 * DEFAULT_CHUNK / MB, grown  # about 20 MB when a chunk was read as one string
        assert resumed["seq"] == 2701
        tail = (await peer.call("session.get", {"sessionId": sid, "since": 2690}))["events"]
        assert [event["seq"] for event in tail] == list(range(2691, 2702))


async def test_a_row_of_the_first_schema_is_still_read_and_resumed(daemon: Daemon, namespace: str) -> None:
    """Rows stored before the chunks (events and ids inline) keep working: paged, folded, resumed."""
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "broke", "id": "b"},
                                                                          {"type": "test_pass", "id": "p"}]})
        before = await peer.call("session.get", {"sessionId": sid})
        await peer.call("session.suspend", {"sessionId": sid})
        conn = await asyncpg.connect(daemon.settings.postgres_dsn or "")
        try:  # rewrite its row the way the first schema stored it
            bodies = await conn.fetch("SELECT kind, body FROM suspended_chunks WHERE namespace = $1 AND "
                                      "session_id = $2 ORDER BY kind, part", namespace, sid)
            members = [m for kind, body in bodies if kind == "e" for m in body.split("\n")]
            ids = {k: v for kind, body in bodies if kind == "i" for k, v in json.loads(body)}
            await conn.execute("UPDATE suspended_sessions SET chunked = false, events = $3::jsonb, ids = $4::jsonb "
                               "WHERE namespace = $1 AND session_id = $2", namespace, sid,
                               json.dumps(members), json.dumps(ids))
            await conn.execute("DELETE FROM suspended_chunks WHERE namespace = $1 AND session_id = $2",
                               namespace, sid)
        finally:
            await conn.close()
        page = await peer.call("session.get", {"sessionId": sid, "since": 1, "limit": 1})
        assert page["events"] == before["events"][1:2] and page["nextSince"] == 2
        at = await peer.call("session.get", {"sessionId": sid, "atSeq": 2})
        assert at["session"]["state"] == "broken"
        await peer.call("session.resume", {"sessionId": sid})
        assert (await peer.call("session.get", {"sessionId": sid}))["events"] == before["events"]
        assert await peer.call("event.emit", {"sessionId": sid, "event": {"type": "x", "id": "b"}}) == {
            "seq": 2, "duplicate": True}


async def test_default_chunks_read_many_events_per_round_trip_and_keep_every_one(
        daemon: Daemon, namespace: str) -> None:
    """At the default 4 MiB a read takes 64 events and a chunk about 280 of these: seams fall mid-read."""
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        for first in range(0, 600, 25):
            await peer.call("event.emitBatch", {"sessionId": sid, "events": [
                {"type": "modified", "id": f"e{n}", "data": {"blob": f"{n:06d}" * 2500}}
                for n in range(first, first + 25)]})
        before = await all_events(peer, sid)
        await peer.call("session.suspend", {"sessionId": sid})
        rows = await chunk_rows(daemon.settings.postgres_dsn or "", namespace, sid)
        assert len([kind for kind, _ in rows if kind == "e"]) == 3  # 9 MB in chunks of 4 MiB and a rest
        assert await all_events(peer, sid) == before
        fork = await peer.call("session.fork", {"sessionId": sid, "atSeq": 400})
        assert await all_events(peer, fork["sessionId"]) == before[:400]
        await peer.call("session.resume", {"sessionId": sid})
        assert await all_events(peer, sid) == before
        fork = await peer.call("session.fork", {"sessionId": sid, "atSeq": 550})
        assert await all_events(peer, fork["sessionId"]) == before[:550]
