"""Checkpoints end to end: triggers, outcome, anchors, failure snapshots, completion, several daemons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.backends import Backends, falkordb_client
from memento_sessions.embedded.postgres import EmbeddedPostgres
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import command_calls, falkordb_url, make_settings, sample, token
from tests.rpcsocket import rpc
from tests.test_fairness import loop_gaps

pytestmark = pytest.mark.anyio
GRAPH_PREFIX = "memento"


async def anchors_on(urls: Endpoints, namespace: str, entity: str) -> list[dict[str, Any]]:
    db = falkordb_client(falkordb_url(urls) or urls.redis_url)
    graph = db.select_graph(f"{GRAPH_PREFIX}_{namespace}")
    result = await graph.query("MATCH (a:SessionAnchor)-[:ANCHORS]->(:CodebaseEntity {id: $id}) "
                               "RETURN a.checkpointId, a.outcome, a.brokeDuring, a.perfDelta, a.externalRef "
                               "ORDER BY a.checkpointId", {"id": entity})
    await db.connection.aclose()
    return [dict(zip(["id", "outcome", "brokeDuring", "perfDelta", "externalRef"], row, strict=True))
            for row in result.result_set]


async def snapshot_rows(dsn: str, session_id: str) -> list[tuple[str, int]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT checkpoint_id, jsonb_array_length(events) AS n FROM session_snapshots "
                                "WHERE session_id = $1 ORDER BY id", session_id)
    finally:
        await conn.close()
    return [(row["checkpoint_id"], row["n"]) for row in rows]


async def test_broken_then_fixed_in_one_window_is_working_with_broke_during(daemon: Daemon, namespace: str,
                                                                           backend_urls: Endpoints) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as a:
        made = await a.call("session.create", {"entityIds": ["fn:parse"]})
        sid, epoch = made["sessionId"], made["epoch"]
        await a.call("event.emitBatch", {"sessionId": sid, "events": [
            {"type": "broke", "changeInfo": {"entityIds": ["fn:parse", "test:io"]},
             "impact": {"severity": "high", "perfDelta": 3}},
            {"type": "modified", "impact": {"severity": "critical", "perfDelta": -1.5}},
            {"type": "test_pass"},
        ]})
        result = await a.call("session.checkpoint", {"sessionId": sid})
    assert result == {"checkpointId": f"cp/{namespace}/{epoch}/{sid}/4", "outcome": "working", "brokeDuring": True,
                      "keyImpacts": ["fn:parse:high", "test:io:high", "modified:critical"], "perfDelta": 1.5,
                      "actors": ["alice"], "entityIds": ["fn:parse", "test:io"]}
    assert await snapshot_rows(backend_urls.postgres_dsn or "", sid) == []
    assert [a["id"] for a in await anchors_on(backend_urls, namespace, "test:io")] == [result["checkpointId"]]


async def test_ending_broken_keeps_a_snapshot_of_every_event_and_completes(daemon: Daemon, namespace: str,
                                                                           backend_urls: Endpoints) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as a, rpc(daemon.port, token("w", namespace)) as w:
        await w.call("sessions.watch", {})
        sid = (await a.call("session.create", {"entityIds": ["fn:x"]}))["sessionId"]
        await w.notification("sessions.announce")
        await w.call("session.subscribe", {"sessionId": sid})
        for i in range(6):
            await a.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "data": {"i": i}}})
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "broke",
                                                                "changeInfo": {"entityIds": ["fn:x"]}}})
        result = await a.call("session.checkpoint", {"sessionId": sid, "final": True})
        assert result["outcome"] == "broken" and isinstance(result["snapshotId"], int)
        note = await w.notification("session.checkpoint")
        assert note["params"] == {"sessionId": sid, "checkpointId": result["checkpointId"], "outcome": "broken"}
        done = await w.notification("sessions.announce")
        assert done["params"]["type"] == "completed" and done["params"]["sessionId"] == sid
        late = await a.error("event.emit", {"sessionId": sid, "event": {"type": "modified"}})
        assert late["code"] == -32009
        session = (await a.call("session.get", {"sessionId": sid}))["session"]
        assert session["state"] == "completed" and session["lastCheckpoint"]["id"] == result["checkpointId"]
    assert await snapshot_rows(backend_urls.postgres_dsn or "", sid) == [(result["checkpointId"], 8)]
    anchors = await anchors_on(backend_urls, namespace, "fn:x")
    assert anchors[0]["externalRef"] == f"session_snapshots/checkpoint_id={result['checkpointId']}"
    r = aioredis.Redis.from_url(backend_urls.redis_url)
    for key in keys.session_keys(namespace, sid).all()[:3]:
        assert 0 < await r.ttl(key) <= daemon.settings.checkpoint_grace_ttl
    await r.aclose()


async def test_every_n_events_and_checkpoint_events_trigger_a_checkpoint(backend_urls: Endpoints, tmp_path: Path,
                                                                         namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path, checkpoint_every=5)) as daemon, \
            rpc(daemon.port, token("alice", namespace)) as a:
        made = await a.call("session.create", {})
        sid, cp = made["sessionId"], f"cp/{namespace}/{made['epoch']}/{made['sessionId']}"
        await a.call("session.subscribe", {"sessionId": sid})
        await a.call("event.emitBatch", {"sessionId": sid, "events": [
            {"type": "modified", "changeInfo": {"entityIds": [f"fn:{i}"]}} for i in range(5)]})
        first = await a.notification("session.checkpoint")
        assert first["params"]["checkpointId"] == f"{cp}/5"
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "checkpoint",
                                                                "changeInfo": {"entityIds": ["fn:late"]}}})
        second = await a.notification("session.checkpoint")
        assert second["params"]["checkpointId"] == f"{cp}/6"
    assert [x["id"] for x in await anchors_on(backend_urls, namespace, "fn:3")] == [f"{cp}/5"]
    assert [x["id"] for x in await anchors_on(backend_urls, namespace, "fn:late")] == [f"{cp}/6"]


async def test_two_daemons_checkpointing_at_once_write_once(backend_urls: Endpoints, tmp_path: Path,
                                                            namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path / "1")) as one, \
            running(make_settings(backend_urls, tmp_path / "2")) as two, \
            rpc(one.port, token("a", namespace)) as a, rpc(two.port, token("b", namespace)) as b:
        made = await a.call("session.create", {"entityIds": ["fn:shared", "fn:other"]})
        sid = made["sessionId"]
        await b.call("event.emit", {"sessionId": sid, "event": {"type": "broke"}})
        results: list[Any] = []

        async def ask(peer: Any) -> None:
            results.append(await peer.call("session.checkpoint", {"sessionId": sid}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, a)
            tg.start_soon(ask, b)
    assert results[0]["checkpointId"] == results[1]["checkpointId"] == f"cp/{namespace}/{made['epoch']}/{sid}/2"
    assert len(await anchors_on(backend_urls, namespace, "fn:shared")) == 1
    assert len(await anchors_on(backend_urls, namespace, "fn:other")) == 1
    assert len(await snapshot_rows(backend_urls.postgres_dsn or "", sid)) == 1


@pytest.mark.slow
async def test_postgres_down_at_checkpoint_time_loses_no_snapshot(backend_urls: Endpoints, tmp_path: Path,
                                                                  namespace: str) -> None:
    postgres = EmbeddedPostgres(tmp_path / "pg")
    postgres.start()
    settings = make_settings(backend_urls, tmp_path, postgres_dsn=postgres.url)
    try:
        async with running(settings) as daemon, rpc(daemon.port, token("a", namespace)) as a:
            sid = (await a.call("session.create", {"entityIds": ["fn:pg"]}))["sessionId"]
            await a.call("event.emit", {"sessionId": sid, "event": {"type": "broke"}})
            await anyio.to_thread.run_sync(postgres.stop)
            result = await a.call("session.checkpoint", {"sessionId": sid})
            assert result["outcome"] == "broken" and result["snapshotPending"] is True
            assert [x["id"] for x in await anchors_on(backend_urls, namespace, "fn:pg")] == [result["checkpointId"]]
            await anyio.sleep(1.0)
            await anyio.to_thread.run_sync(postgres.start)
            with anyio.fail_after(40):
                while not await snapshot_rows(postgres.url, sid):
                    await anyio.sleep(0.2)
            await a.call("session.checkpoint", {"sessionId": sid})
            await anyio.sleep(0.5)
        assert await snapshot_rows(postgres.url, sid) == [(result["checkpointId"], 2)]
    finally:
        postgres.stop()


async def test_kg_upsert_needs_kg_write_and_names_bad_fields(daemon: Daemon, namespace: str,
                                                             backend_urls: Endpoints) -> None:
    nodes = [{"id": "cluster:io", "labels": ["SemanticCluster"], "props": {"name": "I/O"}},
             {"id": "fn:read", "labels": ["CodebaseEntity"], "props": {"path": "io.py"}}]
    edges = [{"from": "fn:read", "to": "cluster:io", "type": "MEMBER_OF_CLUSTER", "props": {}}]
    async with rpc(daemon.port, token("w", namespace)) as plain:
        assert (await plain.error("kg.upsert", {"nodes": nodes}))["code"] == -32001
    async with rpc(daemon.port, token("w", namespace, scope="kg:write sessions:read")) as writer:
        bad = await writer.error("kg.upsert", {"nodes": [{"id": "x", "labels": ["NotALabel"]}]})
        assert bad["code"] == -32602 and bad["data"][0]["field"].startswith("nodes.0.labels")
        assert await writer.call("kg.upsert", {"nodes": nodes, "edges": edges}) == {"nodes": 2, "edges": 1}
    db = falkordb_client(falkordb_url(backend_urls) or backend_urls.redis_url)
    graph = db.select_graph(f"{GRAPH_PREFIX}_{namespace}")
    rows = (await graph.query("MATCH (e {id: 'fn:read'})-[:MEMBER_OF_CLUSTER]->(c) RETURN c.name")).result_set
    await db.connection.aclose()
    assert rows == [["I/O"]]


async def test_entities_past_the_cap_are_counted_not_anchored(backend_urls: Endpoints, tmp_path: Path,
                                                              namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, checkpoint_max_entities=40, anchor_chunk=16,
                             checkpoint_every=1000)
    skipped = sample("memento_checkpoint_entities_skipped_total")
    async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("event.emitBatch", {"sessionId": sid, "events": [
            {"type": "modified", "changeInfo": {"entityIds": [f"fn:{i:03d}.{j}" for j in range(10)]},
             "impact": {"severity": "high"}} for i in range(10)]})
        result = await a.call("session.checkpoint", {"sessionId": sid})
    named = sorted(f"fn:{i:03d}.{j}" for i in range(10) for j in range(10))
    assert result["entityIds"] == named[:40] and result["entitiesSkipped"] == 60
    assert len(result["keyImpacts"]) == 40
    assert sample("memento_checkpoint_entities_skipped_total") - skipped == 60
    assert [len(await anchors_on(backend_urls, namespace, entity)) for entity in (named[0], named[39])] == [1, 1]
    assert await anchors_on(backend_urls, namespace, named[40]) == []
    links = await graph_rows(backend_urls, namespace, "MATCH (:SessionAnchor)-[r:ANCHORS]->() RETURN count(r)")
    assert links == [[40]]


async def graph_rows(urls: Endpoints, namespace: str, query: str) -> list[list[Any]]:
    db = falkordb_client(falkordb_url(urls) or urls.redis_url)
    try:
        return list((await db.select_graph(f"{GRAPH_PREFIX}_{namespace}").query(query)).result_set)
    finally:
        await db.connection.aclose()


async def test_a_checkpoint_of_a_huge_window_lets_other_work_run(backend_urls: Endpoints, tmp_path: Path,
                                                                 namespace: str) -> None:
    """A window of 500 events x 256 new ids (128,000, in two batches under the 1 MB frame) is decoded and
    summarised a part at a time: the daemon's event loop (this test's too) never waits on it for long, and the result is
    the first MEMENTO_CHECKPOINT_MAX_ENTITIES ids in order, the rest counted."""
    settings = make_settings(backend_urls, tmp_path, checkpoint_every=100_000)
    async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        events = [{"type": "modified", "changeInfo": {"entityIds": [f"n{i:03d}.{j:03d}" for j in range(256)]}}
                  for i in range(500)]
        for half in (events[:250], events[250:]):
            await a.call("event.emitBatch", {"sessionId": sid, "events": half})
        async with loop_gaps() as gaps:
            result = await a.call("session.checkpoint", {"sessionId": sid})
    assert result["entityIds"] == sorted(f"n{i:03d}.{j:03d}" for i in range(8) for j in range(256))
    assert result["entitiesSkipped"] == 128_000 - 2048
    assert max(gaps) < 0.05, f"the event loop waited {max(gaps) * 1000:.0f} ms on the checkpoint"


async def test_a_checkpoint_reads_its_window_a_page_at_a_time(backend_urls: Endpoints, backends: Backends,
                                                              tmp_path: Path, namespace: str) -> None:
    """A window can hold a session's every event (300 MB at the largest event size): the daemon reads it
    MEMENTO_SUSPEND_CHUNK_BYTES at that size a read (one event at the smallest setting), with the same result
    as one read of it all."""
    settings = make_settings(backend_urls, tmp_path, checkpoint_every=100_000, suspend_chunk_bytes=64 * 1024)
    async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("event.emitBatch", {"sessionId": sid, "events": [
            {"type": "modified", "changeInfo": {"entityIds": [f"fn:{i:02d}", "fn:all"]}, "impact": {"severity": "low"}}
            for i in range(30)]})
        await a.call("event.emit", {"sessionId": sid, "event": {"type": "test_pass"}})
        before = await command_calls(backends, "zrangebyscore")
        result = await a.call("session.checkpoint", {"sessionId": sid})
        reads = await command_calls(backends, "zrangebyscore") - before
    assert result["entityIds"] == sorted([f"fn:{i:02d}" for i in range(30)] + ["fn:all"])
    assert result["outcome"] == "working" and result["actors"] == ["alice"] and "entitiesSkipped" not in result
    assert reads >= 31, f"the window of 31 events read in {reads} reads"


async def test_a_broken_window_larger_than_a_page_keeps_every_event_in_its_snapshot(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    """Its snapshot stores every event of it: that window is read whole with the view, in one read."""
    settings = make_settings(backend_urls, tmp_path, checkpoint_every=100_000, suspend_chunk_bytes=64 * 1024)
    async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        await a.call("event.emitBatch", {"sessionId": sid, "events": [
            *({"type": "modified", "data": {"i": i}} for i in range(6)),
            {"type": "broke", "changeInfo": {"entityIds": ["fn:x"]}}]})
        result = await a.call("session.checkpoint", {"sessionId": sid, "final": True})
    assert result["outcome"] == "broken" and result["entityIds"] == ["fn:x"]
    assert await snapshot_rows(backend_urls.postgres_dsn or "", sid) == [(result["checkpointId"], 7)]
