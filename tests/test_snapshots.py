"""Failure snapshots on the real Postgres: idempotent inserts, day partitions, retries while it is down."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from prometheus_client import REGISTRY

from memento_sessions.backends import CREATE_MIGRATIONS_TABLE, Postgres
from memento_sessions.backends import apply as _apply
from memento_sessions.checkpoints.snapshots import MIGRATIONS, Snapshots, partition_ddl, partition_name
from memento_sessions.embedded.postgres import EmbeddedPostgres
from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.errors import BackendUnavailable

pytestmark = pytest.mark.anyio
NOW = datetime.now(UTC)
EVENTS = [
    {"seq": 1, "type": "start", "actor": "agent-a", "changeInfo": {"entityIds": ["svc.a"], "operation": "init"}},
    {"seq": 2, "type": "broke", "actor": "agent-a", "impact": {"severity": "high", "testsFailed": ["t1"]}},
]


@pytest.fixture
async def postgres(backend_urls: Endpoints) -> AsyncIterator[Postgres]:
    assert backend_urls.postgres_dsn is not None
    pg = Postgres(backend_urls.postgres_dsn)
    yield pg
    await pg.close()


@pytest.fixture
def store(postgres: Postgres) -> Snapshots:
    return Snapshots(postgres)


def checkpoint() -> str:
    return f"cp-{uuid.uuid4().hex}"


async def fetch(postgres: Postgres, query: str, *args: Any) -> list[asyncpg.Record]:
    pool = await postgres.pool()
    return list(await pool.fetch(query, *args))


async def test_store_is_idempotent_on_checkpoint_id(store: Snapshots, postgres: Postgres, namespace: str) -> None:
    cp = checkpoint()
    counted = REGISTRY.get_sample_value("memento_failure_snapshots_total") or 0.0
    first = await store.store_snapshot(namespace, "s-1", cp, "broken", EVENTS)
    again = await store.store_snapshot(namespace, "s-1", cp, "broken", EVENTS + EVENTS, NOW + timedelta(days=3))
    assert first == again
    assert REGISTRY.get_sample_value("memento_failure_snapshots_total") == counted + 1, "a re-run is not counted"
    found = await fetch(postgres, "SELECT id, outcome, events::text FROM session_snapshots "
                                  "WHERE checkpoint_id = $1", cp)
    assert [(row["id"], row["outcome"], json.loads(row["events"])) for row in found] == [(first, "broken", EVENTS)]


async def test_retry_store_refuses_at_once_when_postgres_is_off(namespace: str) -> None:
    with anyio.fail_after(1), pytest.raises(BackendUnavailable, match="postgres is off"):
        await Snapshots(Postgres(None)).retry_store(namespace, "s-1", checkpoint(), "broken", EVENTS)


async def test_concurrent_stores_of_one_checkpoint_write_one_row(postgres: Postgres, backend_urls: Endpoints,
                                                                 namespace: str) -> None:
    cp, ids = checkpoint(), []
    assert backend_urls.postgres_dsn is not None
    daemons = [Snapshots(Postgres(backend_urls.postgres_dsn)) for _ in range(6)]

    async def store_one(snapshots: Snapshots) -> None:
        ids.append(await snapshots.store_snapshot(namespace, "s-1", cp, "broken", EVENTS))

    async with anyio.create_task_group() as tg:
        for snapshots in daemons:
            tg.start_soon(store_one, snapshots)
    for snapshots in daemons:
        await snapshots.postgres.close()
    assert len(set(ids)) == 1 and len(ids) == 6
    assert len(await fetch(postgres, "SELECT 1 FROM session_snapshots WHERE checkpoint_id = $1", cp)) == 1


async def test_latest_snapshot_holds_every_event(store: Snapshots, namespace: str) -> None:
    await store.store_snapshot(namespace, "s-1", checkpoint(), "broken", EVENTS[:1], NOW - timedelta(hours=2))
    newest = await store.store_snapshot(namespace, "s-1", checkpoint(), "broken", EVENTS, NOW)
    await store.store_snapshot(namespace, "s-other", checkpoint(), "broken", [], NOW + timedelta(hours=1))
    latest = await store.latest_snapshot(namespace, "s-1")
    assert latest is not None
    assert (latest.id, latest.session_id, latest.outcome, latest.events) == (newest, "s-1", "broken", EVENTS)
    assert await store.latest_snapshot("another-namespace", "s-1") is None


async def test_old_partitions_are_dropped_and_newer_kept(store: Snapshots, postgres: Postgres, namespace: str) -> None:
    ages = (45, 40, 29, 2)
    cps = {age: checkpoint() for age in ages}
    for age, cp in cps.items():
        await store.store_snapshot(namespace, "s-1", cp, "broken", EVENTS, NOW - timedelta(days=age))
    dropped = await store.drop_old_partitions(30)
    assert {partition_name((NOW - timedelta(days=age)).date()) for age in (45, 40)} <= set(dropped)
    assert not {partition_name((NOW - timedelta(days=age)).date()) for age in (29, 2)} & set(dropped)
    kept = await fetch(postgres, "SELECT checkpoint_id FROM session_snapshots WHERE namespace = $1", namespace)
    assert sorted(row["checkpoint_id"] for row in kept) == sorted([cps[29], cps[2]])
    ids = await fetch(postgres, "SELECT checkpoint_id FROM snapshot_ids WHERE checkpoint_id = ANY($1)",
                      list(cps.values()))
    assert len(ids) == 2  # the dropped snapshots' ids are forgotten too
    assert await store.drop_old_partitions(30) == []


async def test_migration_is_safe_when_daemons_start_together(postgres: Postgres, backend_urls: Endpoints) -> None:
    database = f"t_{uuid.uuid4().hex[:12]}"
    pool = await postgres.pool()
    await pool.execute(f'CREATE DATABASE "{database}"')
    assert backend_urls.postgres_dsn is not None
    dsn = backend_urls.postgres_dsn.rsplit("/", 1)[0] + "/" + database
    daemons = [Snapshots(Postgres(dsn)) for _ in range(4)]
    try:
        async with anyio.create_task_group() as tg:
            for snapshots in daemons:
                tg.start_soon(snapshots.migrate)
        fresh = Postgres(dsn)
        versions = await fetch(fresh, "SELECT version FROM memento_schema_migrations")
        partitions = await fetch(fresh, "SELECT count(*) FROM pg_inherits "
                                        "WHERE inhparent = 'session_snapshots'::regclass")
        await fresh.close()
    finally:
        for snapshots in daemons:
            await snapshots.postgres.close()
        await pool.execute(f'DROP DATABASE "{database}"')
    assert sorted(row["version"] for row in versions) == [1, 2]
    assert partitions[0][0] == 2  # today and tomorrow


async def test_version_1_tables_are_migrated_in_place(postgres: Postgres, backend_urls: Endpoints) -> None:
    """A database written by the first schema keeps its rows; ids become unique per namespace."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    pool = await postgres.pool()
    await pool.execute(f'CREATE DATABASE "{database}"')
    assert backend_urls.postgres_dsn is not None
    dsn = backend_urls.postgres_dsn.rsplit("/", 1)[0] + "/" + database
    old = Postgres(dsn)
    try:
        old_pool = await old.pool()
        async with old_pool.acquire() as conn:
            await conn.execute(CREATE_MIGRATIONS_TABLE)
            await _apply(conn, 1, MIGRATIONS[0][1])
            await conn.execute(partition_ddl(NOW.date()))
            await conn.execute("INSERT INTO snapshot_ids (checkpoint_id, snapshot_at) VALUES ('cp-s-1-2', $1)", NOW)
            await conn.execute("INSERT INTO session_snapshots (id, session_id, checkpoint_id, namespace, outcome, "
                               "events, snapshot_at) SELECT id, 's-1', 'cp-s-1-2', 'ns-a', 'broken', $1::jsonb, $2 "
                               "FROM snapshot_ids", json.dumps(EVENTS), NOW)
        store = Snapshots(old)
        await store.migrate()
        kept = await store.latest_snapshot("ns-a", "s-1")
        assert kept is not None
        assert (kept.checkpoint_id, kept.events, kept.epoch, kept.from_seq, kept.to_seq) == \
            ("cp-s-1-2", EVENTS, "", 0, 2)
        # The same checkpoint id in another namespace is another snapshot now.
        theirs = await store.store_snapshot("ns-b", "s-1", "cp-s-1-2", "broken", EVENTS[1:], from_seq=1)
        assert theirs != kept.id and await store.store_snapshot("ns-a", "s-1", "cp-s-1-2", "broken", []) == kept.id
        versions = await fetch(old, "SELECT version FROM memento_schema_migrations ORDER BY version")
        assert [row["version"] for row in versions] == [1, 2]
    finally:
        await old.close()
        await pool.execute(f'DROP DATABASE "{database}"')


async def test_a_session_s_rows_read_back_as_every_event_once(store: Snapshots, namespace: str) -> None:
    """Rows of the newest epoch only, joined in seq order; a seq two rows hold (a re-run) appears once."""
    events = [{"seq": seq, "type": "modified"} for seq in range(1, 8)]
    await store.store_snapshot(namespace, "s-1", checkpoint(), "broken", events[:3], NOW - timedelta(hours=3),
                               epoch="old")
    await store.store_snapshot(namespace, "s-1", checkpoint(), "broken", events[4:], NOW, epoch="new", from_seq=4)
    await store.store_snapshot(namespace, "s-1", checkpoint(), "broken", events[:5], NOW - timedelta(hours=1),
                               epoch="new")
    latest = await store.latest_snapshot(namespace, "s-1")
    assert latest is not None
    assert (latest.epoch, latest.from_seq, latest.to_seq, latest.events) == ("new", 0, 7, events)
    rows = await store.epoch_snapshots(namespace, "s-1", "old")
    assert [(row.from_seq, row.to_seq, len(row.events)) for row in rows] == [(0, 3, 3)]


def retry_count() -> float:
    return REGISTRY.get_sample_value("memento_backend_errors_total", {"backend": "postgres"}) or 0.0


async def test_retry_store_waits_for_postgres_and_writes_exactly_once(tmp_path: Path, namespace: str) -> None:
    server = EmbeddedPostgres(tmp_path / "pg", free_port())
    await anyio.to_thread.run_sync(server.start)
    warm, cold = Snapshots(Postgres(server.url)), Snapshots(Postgres(server.url))
    try:
        await warm.store_snapshot(namespace, "s-0", checkpoint(), "broken", EVENTS)  # a pool with live connections
        await anyio.to_thread.run_sync(server.stop)
        results: dict[str, int] = {}
        cps = {"warm": checkpoint(), "cold": checkpoint()}
        before = retry_count()
        async with anyio.create_task_group() as tg:
            for name, snapshots in (("warm", warm), ("cold", cold)):
                tg.start_soon(_retry_into, results, name, snapshots, namespace, cps[name])
            await anyio.sleep(1.5)
            assert results == {}  # still retrying while Postgres is down
            assert retry_count() - before >= 6  # at least 3 tries each, backing off
            await anyio.to_thread.run_sync(server.start)
            with anyio.fail_after(30):
                while len(results) < 2:
                    await anyio.sleep(0.05)
        for name, snapshots in (("warm", warm), ("cold", cold)):
            assert await snapshots.store_snapshot(namespace, "s-1", cps[name], "broken", EVENTS) == results[name]
            rows = await fetch(snapshots.postgres, "SELECT events::text FROM session_snapshots "
                                                   "WHERE checkpoint_id = $1", cps[name])
            assert len(rows) == 1
    finally:
        await warm.postgres.close()
        await cold.postgres.close()
        await anyio.to_thread.run_sync(server.stop)


async def _retry_into(results: dict[str, int], name: str, snapshots: Snapshots, namespace: str, cp: str) -> None:
    results[name] = await snapshots.retry_store(namespace, "s-1", cp, "broken", EVENTS, max_delay=0.4)


async def test_first_callers_at_once_share_one_pool(backend_urls: Endpoints) -> None:
    """Ten first calls racing get one pool: each used to open its own, and all but the last leaked."""
    postgres = Postgres(backend_urls.postgres_dsn)
    pools: list[asyncpg.Pool] = []

    async def first_call() -> None:
        pools.append(await postgres.pool())

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(first_call)
        assert len(pools) == 10 and len({id(pool) for pool in pools}) == 1
    finally:
        await postgres.close()


async def test_a_released_connection_is_reused_without_a_reset_query_and_never_inside_a_transaction(
        backend_urls: Endpoints, namespace: str) -> None:
    """The pool skips asyncpg's reset query (one round trip per use; the daemon keeps no session state), but a
    connection given back with a transaction open is still rolled back before anyone gets it again."""
    postgres = Postgres(backend_urls.postgres_dsn)
    pool = await postgres.pool()
    table = f"reset_{uuid.uuid4().hex[:12]}"
    try:
        await pool.execute(f"CREATE TABLE {table} (v text)")
        async with pool.acquire() as conn:
            before = conn._protocol.queries_count  # type: ignore[attr-defined]
            await conn.execute("BEGIN")
            await conn.execute(f"INSERT INTO {table} VALUES ('left open')")
            pid = await conn.fetchval("SELECT pg_backend_pid()")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == pid  # the same connection (the pool's only one)
            assert not conn.is_in_transaction()
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0  # the open insert was rolled back
            # BEGIN, INSERT, the pid, the rollback, the pid again and the count: no reset query in between
            assert conn._protocol.queries_count - before == 6  # type: ignore[attr-defined]
    finally:
        await pool.execute(f"DROP TABLE IF EXISTS {table}")
        await postgres.close()
