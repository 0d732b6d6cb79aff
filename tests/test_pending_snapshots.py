"""Failure snapshots per (namespace, epoch, checkpoint), linear in a session's events, and kept in Redis
while Postgres cannot take them, across a daemon restart."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY
from redis.crc import key_slot

from memento_sessions import keys
from memento_sessions.backends import Backends, Postgres, falkordb_client, is_cluster_client
from memento_sessions.checkpoints.pending import Pending, PendingSnapshots, index_member
from memento_sessions.checkpoints.snapshots import Snapshot, Snapshots
from memento_sessions.embedded.postgres import EmbeddedPostgres
from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import falkordb_url, make_settings, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


async def rows_of(dsn: str, namespace: str, session_id: str) -> list[dict[str, Any]]:
    """The session's snapshot rows in seq order, with the seqs each holds."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT checkpoint_id, epoch, from_seq, to_seq, events::text AS events "
                                "FROM session_snapshots WHERE namespace = $1 AND session_id = $2 "
                                "ORDER BY from_seq, id", namespace, session_id)
    finally:
        await conn.close()
    return [{"checkpointId": row["checkpoint_id"], "epoch": row["epoch"], "range": (row["from_seq"], row["to_seq"]),
             "seqs": [event["seq"] for event in json.loads(row["events"])]} for row in rows]


async def latest_snapshot(dsn: str, namespace: str, session_id: str) -> Snapshot | None:
    """The session's latest snapshot as the daemon reads it, on a pool closed afterwards."""
    postgres = Postgres(dsn)
    try:
        return await Snapshots(postgres).latest_snapshot(namespace, session_id)
    finally:
        await postgres.close()


async def anchor_refs(urls: Endpoints, namespace: str, entity: str) -> list[tuple[str, str]]:
    """The checkpoint ids and external refs of the anchors on `entity`, read from wherever the graphs live."""
    db = falkordb_client(falkordb_url(urls) or urls.redis_url)
    result = await db.select_graph(f"memento_{namespace}").query(
        "MATCH (a:SessionAnchor)-[:ANCHORS]->(:CodebaseEntity {id: $id}) RETURN a.checkpointId, a.externalRef "
        "ORDER BY a.timestamp", {"id": entity})
    await db.connection.aclose()
    return [(row[0], row[1]) for row in result.result_set]


async def test_two_namespaces_with_a_broken_build_1_each_get_their_own_snapshot(
        daemon: Daemon, namespace: str, backend_urls: Endpoints) -> None:
    dsn, other = backend_urls.postgres_dsn or "", namespace + "b"
    results = {}
    for ns in (namespace, other):
        async with rpc(daemon.port, token("alice", ns)) as a:
            made = await a.call("session.create", {"sessionId": "build-1", "entityIds": ["fn:build"]})
            await a.call("event.emit", {"sessionId": "build-1", "event": {"type": "broke", "data": {"ns": ns}}})
            results[ns] = (made["epoch"], await a.call("session.checkpoint", {"sessionId": "build-1"}))
    for ns, (epoch, result) in results.items():
        assert result["checkpointId"] == f"cp/{ns}/{epoch}/build-1/2"
        assert isinstance(result["snapshotId"], int) and "snapshotPending" not in result
        rows = await rows_of(dsn, ns, "build-1")
        assert [(r["checkpointId"], r["epoch"], r["range"], r["seqs"]) for r in rows] == \
            [(result["checkpointId"], epoch, (0, 2), [1, 2])]
    assert results[namespace][1]["snapshotId"] != results[other][1]["snapshotId"]
    latest = await latest_snapshot(dsn, other, "build-1")
    assert latest is not None and latest.events[1]["data"] == {"ns": other}


async def test_automatic_broken_checkpoints_store_each_event_once(backend_urls: Endpoints, tmp_path: Path,
                                                                  namespace: str) -> None:
    dsn = backend_urls.postgres_dsn or ""
    async with running(make_settings(backend_urls, tmp_path, checkpoint_every=5)) as daemon, \
            rpc(daemon.port, token("alice", namespace)) as a:
        sid = (await a.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await a.call("session.subscribe", {"sessionId": sid})
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "broke"}})
        for _ in range(4):  # 18 more events: automatic checkpoints at 5, 10, 15 and 20, all broken
            await a.call("event.emitBatch", {"sessionId": sid, "events": [
                {"type": "modified", "changeInfo": {"entityIds": ["fn:a"]}}] * (5 if _ else 3)})
            await a.notification("session.checkpoint")
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "test_pass"}})
        working = await a.call("session.checkpoint", {"sessionId": sid})  # 21: working, no snapshot
        await a.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified"}, {"type": "broke"}]})
        final = await a.call("session.checkpoint", {"sessionId": sid, "final": True})  # 23, broken
        again = await a.call("session.checkpoint", {"sessionId": sid, "final": True})
    assert working["outcome"] == "working" and "snapshotId" not in working
    assert final["outcome"] == "broken" and again == {**final, "checkpointId": final["checkpointId"]}
    rows = await rows_of(dsn, namespace, sid)
    assert [r["range"] for r in rows] == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 23)]
    assert [seq for r in rows for seq in r["seqs"]] == list(range(1, 24))  # every event once, in order
    latest = await latest_snapshot(dsn, namespace, sid)
    assert latest is not None and [e["seq"] for e in latest.events] == list(range(1, 24))
    assert latest.checkpoint_id == final["checkpointId"]


async def test_a_recreated_session_never_reuses_an_old_anchor_or_snapshot(daemon: Daemon, namespace: str,
                                                                         backend_urls: Endpoints) -> None:
    made, done = [], []
    r = aioredis.Redis.from_url(backend_urls.redis_url)
    async with rpc(daemon.port, token("alice", namespace)) as a:
        for life in range(2):
            made.append(await a.call("session.create", {"sessionId": "build-1", "entityIds": ["fn:x"]}))
            await a.call("event.emit", {"sessionId": "build-1", "event": {"type": "broke", "data": {"life": life}}})
            done.append(await a.call("session.checkpoint", {"sessionId": "build-1"}))
            await r.delete(*keys.session_keys(namespace, "build-1").all())  # as if it expired
    await r.aclose()
    assert made[0]["epoch"] != made[1]["epoch"]
    assert done[0]["checkpointId"] != done[1]["checkpointId"]
    assert done[0]["snapshotId"] != done[1]["snapshotId"]
    assert [ref[0] for ref in await anchor_refs(backend_urls, namespace, "fn:x")] == \
        [done[0]["checkpointId"], done[1]["checkpointId"]]
    rows = await rows_of(backend_urls.postgres_dsn or "", namespace, "build-1")
    assert sorted((r["epoch"], r["seqs"]) for r in rows) == sorted((m["epoch"], [1, 2]) for m in made)
    latest = await latest_snapshot(backend_urls.postgres_dsn or "", namespace, "build-1")
    assert latest is not None and latest.epoch == made[1]["epoch"] and latest.events[1]["data"] == {"life": 1}


def deferred() -> float:
    return REGISTRY.get_sample_value("memento_snapshots_deferred_total") or 0.0


@pytest.mark.slow
async def test_a_snapshot_postgres_cannot_take_waits_in_redis_and_a_new_daemon_stores_it(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    postgres = EmbeddedPostgres(tmp_path / "pg", free_port())
    await anyio.to_thread.run_sync(postgres.start)
    settings = make_settings(backend_urls, tmp_path / "d", postgres_dsn=postgres.url)
    r = aioredis.Redis.from_url(backend_urls.redis_url, decode_responses=True)
    pending_key = keys.pending_snapshots(namespace, "build-1")
    try:
        before = deferred()
        async with running(settings) as first, rpc(first.port, token("a", namespace)) as a:
            await a.call("session.create", {"sessionId": "build-1", "entityIds": ["fn:pg"]})
            await a.call("event.emitBatch", {"sessionId": "build-1", "events": [{"type": "broke"}, {"type": "x"}]})
            await anyio.to_thread.run_sync(postgres.stop)
            result = await a.call("session.checkpoint", {"sessionId": "build-1"})
            assert result["outcome"] == "broken" and result["snapshotPending"] is True
        assert deferred() == before + 1
        # The first daemon is gone; the snapshot is in Redis, under the session's hash tag, with a TTL.
        held = json.loads(await r.hget(pending_key, result["checkpointId"]) or "{}")
        assert (held["from_seq"], held["to_seq"], [e["seq"] for e in held["events"]]) == (0, 3, [1, 2, 3])
        assert 0 < await r.ttl(pending_key) <= settings.snapshot_max_age_days * 86_400
        assert json.dumps([namespace, "build-1"]) in await r.zrange(keys.pending_snapshot_index(), 0, -1)
        ref = f"session_snapshots/checkpoint_id={result['checkpointId']}"
        assert await anchor_refs(backend_urls, namespace, "fn:pg") == [(result["checkpointId"], ref)]
        await anyio.to_thread.run_sync(postgres.start)
        async with running(settings):
            with anyio.fail_after(20):
                while not await rows_of(postgres.url, namespace, "build-1"):
                    await anyio.sleep(0.1)
            with anyio.fail_after(5):
                while await r.exists(pending_key):
                    await anyio.sleep(0.1)
        rows = await rows_of(postgres.url, namespace, "build-1")
        assert [(x["checkpointId"], x["range"], x["seqs"]) for x in rows] == [(result["checkpointId"], (0, 3),
                                                                              [1, 2, 3])]
        assert json.dumps([namespace, "build-1"]) not in await r.zrange(keys.pending_snapshot_index(), 0, -1)
    finally:
        await r.aclose()
        await anyio.to_thread.run_sync(postgres.stop)


async def test_pending_entries_and_their_index_each_live_in_one_slot_and_flush_on_any_topology(
        backends: Backends, namespace: str) -> None:
    """put writes the session's hash (one MULTI on one key) and then the global index: on a Redis Cluster these
    are two slots, so no transaction or script may span them; put, entries and flush work there as on one Redis."""
    store, index = PendingSnapshots(backends.redis, 3600), keys.pending_snapshot_index()
    sessions = ["s-a", "s-b"]
    if is_cluster_client(backends.redis):
        assert len({key_slot(index.encode()), *(key_slot(keys.pending_snapshots(namespace, s).encode())
                                                for s in sessions)}) == 3
    made = [Pending(namespace, sid, f"cp/{namespace}/e/{sid}/2", "e", 0, 2, "broken",
                    [{"seq": 1, "type": "start"}, {"seq": 2, "type": "broke"}], datetime.now(UTC)) for sid in sessions]
    for pending in made:
        await store.put(pending)
    assert [await store.entries(namespace, sid) for sid in sessions] == [[made[0]], [made[1]]]
    assert 0 < await backends.redis.ttl(keys.pending_snapshots(namespace, "s-a")) <= 3600
    assert {index_member(namespace, sid) for sid in sessions} <= set(await backends.redis.zrange(index, 0, -1))
    assert await store.flush(Snapshots(backends.postgres)) >= 2  # other tests' leftovers may be stored too
    assert [await store.entries(namespace, sid) for sid in sessions] == [[], []]
    assert not {index_member(namespace, sid) for sid in sessions} & set(await backends.redis.zrange(index, 0, -1))
    rows = await rows_of(backends.postgres.dsn or "", namespace, "s-a")
    assert [(r["checkpointId"], r["range"], r["seqs"]) for r in rows] == [(made[0].checkpoint_id, (0, 2), [1, 2])]
