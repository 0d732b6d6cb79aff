"""Forks and snapshots bounded: snapshot bytes per session (MEMENTO_SNAPSHOT_MAX_BYTES), a fork copies only
the snapshot it needs, fork chains stop at MEMENTO_FORK_MAX_DEPTH, and heavy requests past
MEMENTO_HEAVY_MAX at once are refused (-32029, retryable), writing nothing."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.sessions.functions import FunctionStore
from tests.helpers import make_settings, sample, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio

SNAPSHOT_BYTES = 64 * 1024


@pytest.fixture
async def bounded(backend_urls: Endpoints, tmp_path: Path) -> AsyncIterator[Daemon]:
    settings = make_settings(backend_urls, tmp_path, snapshot_max_bytes=SNAPSHOT_BYTES, fork_max_depth=3,
                             heavy_max=1, checkpoint_every=100_000, auto_compact=False)
    async with running(settings) as daemon:
        yield daemon


async def snapshot_sizes(r: aioredis.Redis, namespace: str, sid: str) -> dict[int, int]:
    ids = keys.session_keys(namespace, sid).ids
    seqs = [int(s) for s in (await r.hget(ids, "~snaps") or "").split()]
    return {seq: await r.hstrlen(ids, f"~snap:{seq}") for seq in seqs}


async def grow(peer: Any, sid: str, rounds: int) -> list[int]:
    """`rounds` batches, each touching 100 new entities, with a snapshot after each; the snapshots' seqs."""
    seqs = []
    for n in range(rounds):
        await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "changeInfo": {
            "entityIds": [f"src/module_{n}/file_{i}.py::function_{i}" for i in range(100)]}}})
        seqs.append((await peer.call("session.snapshot", {"sessionId": sid}))["seq"])
    return seqs


async def test_snapshot_bytes_per_session_are_bounded(bounded: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(bounded.settings.redis_url or "", decode_responses=True)
    async with rpc(bounded.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        seqs = await grow(peer, sid, 12)
        sizes = await snapshot_sizes(r, namespace, sid)
        assert sizes[seqs[-1]] > 8 * 1024  # the snapshots are large enough for the bound to matter
        assert sum(sizes.values()) <= SNAPSHOT_BYTES and seqs[-1] in sizes  # the newest is always kept
        assert len(sizes) < len(seqs)
        at = await peer.call("session.get", {"sessionId": sid, "atSeq": seqs[0]})  # its snapshot went: folded
        assert at["atSeq"] == seqs[0] and at["session"]["seq"] == seqs[0]
    await r.aclose()


async def test_a_fork_copies_only_the_snapshot_it_needs(bounded: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(bounded.settings.redis_url or "", decode_responses=True)
    async with rpc(bounded.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await grow(peer, sid, 3)
        await peer.call("session.checkpoint", {"sessionId": sid})  # compaction stops at the last checkpoint
        assert (await peer.call("session.compact", {"sessionId": sid, "beforeSeq": 3}))["compactedSeq"] == 3
        await grow(peer, sid, 2)
        assert len(await snapshot_sizes(r, namespace, sid)) >= 3
        fork = await peer.call("session.fork", {"sessionId": sid, "atSeq": 6})
        assert list(await snapshot_sizes(r, namespace, fork["sessionId"])) == [3]  # the compaction base alone
        parent_at = await peer.call("session.get", {"sessionId": sid, "atSeq": 5})
        fork_at = await peer.call("session.get", {"sessionId": fork["sessionId"], "atSeq": 5})
        assert {k: v for k, v in fork_at.items() if k not in ("session", "lastCheckpoint")} == {
            k: v for k, v in parent_at.items() if k not in ("session", "lastCheckpoint")}
    await r.aclose()


async def test_fork_chains_stop_at_the_depth_bound(bounded: Daemon, namespace: str) -> None:
    async with rpc(bounded.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        for _ in range(3):
            sid = (await peer.call("session.fork", {"sessionId": sid, "atSeq": 1}))["sessionId"]
        error = await peer.error("session.fork", {"sessionId": sid, "atSeq": 1, "newSessionId": "too-deep"})
        assert error["code"] == -32009 and error["data"] == {"reason": "fork_depth"}
        assert (await peer.error("session.get", {"sessionId": "too-deep"}))["code"] == -32004


WAITING = ("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND wait_event_type = 'Lock' "
           "AND query ILIKE '%suspended_sessions%'")


async def test_heavy_requests_past_the_bound_are_refused_and_retryable(bounded: Daemon, namespace: str) -> None:
    async with rpc(bounded.port, token("alice", namespace)) as peer, \
            rpc(bounded.port, token("alice", namespace)) as other:
        sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        stored = (await peer.call("session.create", {"entityIds": ["fn:b"]}))["sessionId"]
        await peer.call("session.suspend", {"sessionId": stored})
        holder = await asyncpg.connect(bounded.settings.postgres_dsn)
        try:
            async with anyio.create_task_group() as tg, holder.transaction():
                await holder.execute("LOCK TABLE suspended_sessions IN ACCESS EXCLUSIVE MODE")
                tg.start_soon(other.call, "session.resume", {"sessionId": stored})  # holds the one slot
                with anyio.fail_after(10):
                    while not await holder.fetchval(WAITING):
                        await anyio.sleep(0.05)
                for method, params in (("session.fork", {"sessionId": sid, "atSeq": 1, "newSessionId": "later"}),
                                       ("session.suspend", {"sessionId": sid})):
                    error = await peer.error(method, params)
                    assert error["code"] == -32029 and error["data"]["reason"] == "busy", method
                    assert error["data"]["retryAfterMs"] > 0
                assert (await peer.call("session.get", {"sessionId": sid}))["session"]["status"] == "active"
        finally:
            await holder.close()
        assert (await peer.call("session.get", {"sessionId": stored}))["session"]["status"] == "active"
        assert (await peer.error("session.get", {"sessionId": "later"}))["code"] == -32004  # nothing was written
        assert (await peer.call("session.fork", {"sessionId": sid, "atSeq": 1, "newSessionId": "later"}))[
            "sessionId"] == "later"


STAGE_BYTES = 64 * 1024


async def test_a_copy_into_redis_never_sends_more_than_the_stage_chunk_per_call(
        backend_urls: Endpoints, tmp_path: Path, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork and a resume of a 1.8 MB session write it in ms_stage calls of at most MEMENTO_STAGE_CHUNK_BYTES
    of events or ids each (so none holds Redis's one thread for long), and the copy is whole."""
    sent: list[int] = []
    call = FunctionStore.call

    async def recording(store: FunctionStore, function: str, skeys: keys.SessionKeys, *args: str | int,
                        **options: Any) -> Any:
        if function == "ms_stage":
            sent.append(sum(len(str(arg)) for arg in args[4:]))  # after token, ttl, start and kind
        return await call(store, function, skeys, *args, **options)

    monkeypatch.setattr(FunctionStore, "call", recording)
    settings = make_settings(backend_urls, tmp_path, stage_chunk_bytes=STAGE_BYTES, checkpoint_every=100_000)
    async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        for n in range(4):
            await peer.call("event.emitBatch", {"sessionId": sid, "events": [
                {"id": f"e{n}.{i}", "type": "modified", "data": {"blob": "x" * 15_000}} for i in range(30)]})
        parent = await stored_data(settings.redis_url or "", namespace, sid)
        fork = (await peer.call("session.fork", {"sessionId": sid, "atSeq": 120}))["sessionId"]
        forked, copied = await stored_data(settings.redis_url or "", namespace, fork), sum(sent)
        await peer.call("session.suspend", {"sessionId": sid})
        await peer.call("session.resume", {"sessionId": sid})
        resumed = await stored_data(settings.redis_url or "", namespace, sid)
    assert copied > 1_800_000 and sum(sent) > 2 * 1_800_000  # both copies went through ms_stage
    assert max(sent) <= STAGE_BYTES + 64, f"an ms_stage call carried {max(sent):,} bytes"
    assert len(parent) == 120 and forked == parent == resumed


async def stored_data(url: str, namespace: str, sid: str) -> list[tuple[int, str, Any]]:
    """Each stored event's seq, id and data, as Redis holds the session."""
    r = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        members = await r.zrange(keys.session_keys(namespace, sid).events, 0, -1)
    finally:
        await r.aclose()
    return [(e["seq"], e.get("id"), e.get("data")) for e in (json.loads(str(m)) for m in members)]


async def test_a_namespaces_copies_are_paced_to_its_budget_of_bytes(backend_urls: Endpoints, tmp_path: Path,
                                                                      namespace: str) -> None:
    """At MEMENTO_STAGE_PACE_BYTES 256 KiB a second, a fork of 450 KB of events, in calls of 64 KiB, takes
    over 1.2 s (each call waits for those before it, less a tenth of a second of budget), its waits counted;
    another namespace's fork meanwhile is not held back."""
    settings = make_settings(backend_urls, tmp_path, stage_pace_bytes=256 * 1024, stage_chunk_bytes=64 * 1024,
                             checkpoint_every=100_000)
    waited = sample("memento_paced_seconds_total", {"work": "copy"})
    async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as peer, \
            rpc(daemon.port, token("bob", f"{namespace}-b")) as other:
        sid = (await peer.call("session.create", {}))["sessionId"]
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [
            {"type": "modified", "data": {"blob": "x" * 15_000}} for _ in range(30)]})
        small = (await other.call("session.create", {}))["sessionId"]
        await other.call("event.emit", {"sessionId": small, "event": {"type": "modified"}})
        async with anyio.create_task_group() as tg:
            started = time.perf_counter()
            tg.start_soon(peer.call, "session.fork", {"sessionId": sid, "atSeq": 30})
            await anyio.sleep(0.2)
            quick = time.perf_counter()
            await other.call("session.fork", {"sessionId": small, "atSeq": 1})
            quick_took = time.perf_counter() - quick
        took = time.perf_counter() - started
    assert took >= 1.2, took
    assert quick_took < 0.5, quick_took
    assert sample("memento_paced_seconds_total", {"work": "copy"}) - waited >= 0.9
