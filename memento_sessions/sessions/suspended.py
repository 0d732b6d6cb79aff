"""Suspended sessions in Postgres: `suspended_sessions`, one row per (namespace, session id).

A suspended session is moved out of Redis whole and exact: its hash, agents, ids (with its compaction
snapshots) and every stored event, so a resume writes back the same seqs and epoch. A completed session
is copied here too (status `completed`) while Redis still holds it for its grace TTL, so it outlives
Redis until it is archived; `suspended_at` is then the time it was completed. Writes are
idempotent (an upsert keyed by namespace and session id that never replaces a newer copy), so two
daemons suspending the same session at once store one row. The schema is migrated at start, the way
the failure snapshots' is (versions in `memento_schema_migrations`, under an advisory lock).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memento_sessions.backends import Postgres
from memento_sessions.migrations import Migration, migrate

# Versions from 101 up: the failure snapshots' migrations count from 1 in the same table.
MIGRATIONS: tuple[Migration, ...] = (
    (101, (
        """CREATE TABLE suspended_sessions (
            namespace text NOT NULL,
            session_id text NOT NULL,
            epoch text NOT NULL,
            seq bigint NOT NULL,
            status text NOT NULL,
            state text NOT NULL,
            fields jsonb NOT NULL,
            agents jsonb NOT NULL,
            ids jsonb NOT NULL,
            events jsonb,
            summary jsonb NOT NULL,
            suspended_at timestamptz NOT NULL,
            PRIMARY KEY (namespace, session_id)
        )""",
        "CREATE INDEX suspended_sessions_listing ON suspended_sessions (namespace, status, suspended_at DESC)",
    )),
)

UPSERT = """
INSERT INTO suspended_sessions (namespace, session_id, epoch, seq, status, state, fields, agents, ids, events,
                                summary, suspended_at)
VALUES ($1, $2, $3, $4, $12, $5, $6::jsonb, $7::jsonb, $8::jsonb, $9::jsonb, $10::jsonb, $11)
ON CONFLICT (namespace, session_id) DO UPDATE SET
    epoch = EXCLUDED.epoch, seq = EXCLUDED.seq, status = EXCLUDED.status, state = EXCLUDED.state,
    fields = EXCLUDED.fields, agents = EXCLUDED.agents, ids = EXCLUDED.ids, events = EXCLUDED.events,
    summary = EXCLUDED.summary, suspended_at = EXCLUDED.suspended_at
WHERE suspended_sessions.epoch <> EXCLUDED.epoch OR suspended_sessions.seq <= EXCLUDED.seq"""
SELECT_ONE = """
SELECT namespace, session_id, epoch, seq, status, state, fields::text, agents::text, ids::text, events::text,
       summary::text, suspended_at
FROM suspended_sessions WHERE namespace = $1 AND session_id = $2"""
DELETE_RESUMED = "DELETE FROM suspended_sessions WHERE namespace = $1 AND session_id = $2 AND epoch = $3 AND seq = $4"
LIST_PAGE = """
SELECT session_id, epoch, seq, status, state, fields::text, agents::text, suspended_at FROM suspended_sessions
WHERE namespace = $1 AND ($2::text IS NULL OR status = $2) AND suspended_at < $3
ORDER BY suspended_at DESC LIMIT $4"""
FORGET = "DELETE FROM suspended_sessions WHERE namespace = $1 AND session_id = $2"
STORED_AMONG = "SELECT session_id FROM suspended_sessions WHERE namespace = $1 AND session_id = ANY($2::text[])"
ARCHIVE_OLD = """
UPDATE suspended_sessions SET status = 'archived', events = NULL, ids = '{}'::jsonb
WHERE status IN ('suspended', 'completed') AND suspended_at < $1"""


@dataclass(frozen=True, slots=True)
class Suspended:
    """One stored session: what Redis held when it was suspended."""

    namespace: str
    session_id: str
    epoch: str
    seq: int
    status: str
    state: str
    fields: dict[str, str]
    agents: list[str]
    ids: dict[str, str]
    events: list[str] | None  # raw stored members; None once archived
    summary: dict[str, Any]
    suspended_at: datetime


class MigratedStore:
    """A store over the daemon's (lazily connected) Postgres whose schema is migrated on first use.

    Shared by this table and the failure snapshots' (checkpoints/snapshots.py): one place for "migrate
    once per process, safely while other daemons do the same".
    """

    def __init__(self, postgres: Postgres, migrations: tuple[Migration, ...]) -> None:
        self.postgres, self.migrations = postgres, migrations
        self._migrated = False

    async def migrate(self) -> None:
        """Create or upgrade the schema; safe while another daemon does the same."""
        if self._migrated:
            return
        await migrate(self.postgres, self.migrations)
        await self.migrated()
        self._migrated = True

    async def migrated(self) -> None:
        """What a store prepares once its schema is current (nothing here)."""


class SuspendedStore(MigratedStore):
    """The `suspended_sessions` table."""

    def __init__(self, postgres: Postgres) -> None:
        super().__init__(postgres, MIGRATIONS)

    async def put(self, row: Suspended) -> None:
        """Store (or refresh) a suspended session; an older copy never replaces a newer one."""
        await self.migrate()
        pool = await self.postgres.pool()
        await pool.execute(UPSERT, row.namespace, row.session_id, row.epoch, row.seq, row.state,
                           json.dumps(row.fields), json.dumps(row.agents), json.dumps(row.ids),
                           json.dumps(row.events), json.dumps(row.summary), row.suspended_at, row.status)

    async def get(self, namespace: str, session_id: str) -> Suspended | None:
        """The stored session, if any."""
        await self.migrate()
        pool = await self.postgres.pool()
        rec = await pool.fetchrow(SELECT_ONE, namespace, session_id)
        if rec is None:
            return None
        return Suspended(rec[0], rec[1], rec[2], rec[3], rec[4], rec[5], json.loads(rec[6]), json.loads(rec[7]),
                         json.loads(rec[8]), json.loads(rec[9]) if rec[9] else None, json.loads(rec[10]), rec[11])

    async def resumed(self, row: Suspended) -> None:
        """Forget the stored copy once Redis holds it again (only that copy: a newer suspend stays)."""
        pool = await self.postgres.pool()
        await pool.execute(DELETE_RESUMED, row.namespace, row.session_id, row.epoch, row.seq)

    async def forget(self, namespace: str, session_id: str) -> bool:
        """Delete a stored session (session.clear); True when there was one."""
        await self.migrate()
        pool = await self.postgres.pool()
        status: str = await pool.execute(FORGET, namespace, session_id)
        return status.split()[-1] != "0"

    async def page(self, namespace: str, status: str | None, before: datetime, limit: int) -> list[dict[str, Any]]:
        """Stored sessions of a namespace, newest suspension first, suspended before `before`."""
        await self.migrate()
        pool = await self.postgres.pool()
        rows = await pool.fetch(LIST_PAGE, namespace, status, before, limit)
        return [{"sessionId": r[0], "epoch": r[1], "seq": r[2], "status": r[3], "state": r[4],
                 "fields": json.loads(r[5]), "agentIds": sorted(json.loads(r[6])), "suspendedAt": r[7]}
                for r in rows]

    async def stored_among(self, namespace: str, session_ids: list[str]) -> set[str]:
        """Which of `session_ids` have a row here already."""
        await self.migrate()
        pool = await self.postgres.pool()
        return {row[0] for row in await pool.fetch(STORED_AMONG, namespace, session_ids)}

    async def archive(self, older_than: datetime) -> int:
        """Suspended and completed sessions past retention become archived: events dropped, summary kept."""
        await self.migrate()
        pool = await self.postgres.pool()
        status: str = await pool.execute(ARCHIVE_OLD, older_than)
        return int(status.split()[-1])
