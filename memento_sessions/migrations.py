"""Postgres schema versions: one table records them for every store, one advisory lock serialises changes.

Each store (checkpoints' failure snapshots, sessions' suspended sessions) keeps its own numbered migrations
(versions of its own range) and applies the missing ones at start; several daemons starting at once apply
each version once, since the lock is held for the whole transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from memento_sessions.logs import get_logger

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    from memento_sessions.backends import Postgres

    Connection = PoolConnectionProxy[asyncpg.Record]

log = get_logger(__name__)

Migration = tuple[int, tuple[str, ...]]

SCHEMA_LOCK = 0x6D656D656E746F01  # advisory lock key held while changing the schema or partitions
LOCK_SCHEMA = "SELECT pg_advisory_xact_lock($1)"
CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS memento_schema_migrations (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
APPLIED_VERSIONS = "SELECT version FROM memento_schema_migrations"
RECORD_VERSION = "INSERT INTO memento_schema_migrations (version) VALUES ($1) ON CONFLICT DO NOTHING"


async def apply_missing(conn: Connection, migrations: Sequence[Migration]) -> None:
    """Apply the versions not yet recorded, in order, under the schema lock (call inside a transaction)."""
    await conn.execute(LOCK_SCHEMA, SCHEMA_LOCK)
    await conn.execute(CREATE_MIGRATIONS_TABLE)
    applied = {row["version"] for row in await conn.fetch(APPLIED_VERSIONS)}
    for version, statements in migrations:
        if version not in applied:
            await apply(conn, version, statements)


async def apply(conn: Connection, version: int, statements: tuple[str, ...]) -> None:
    """Run one migration's statements and record its version."""
    for statement in statements:
        await conn.execute(statement)
    await conn.execute(RECORD_VERSION, version)
    log.info("postgres schema migrated", version=version)


async def migrate(postgres: Postgres, migrations: Sequence[Migration]) -> None:
    """Apply a store's missing migrations in one transaction on the daemon's Postgres."""
    pool = await postgres.pool()
    async with pool.acquire() as conn, conn.transaction():
        await apply_missing(conn, migrations)
