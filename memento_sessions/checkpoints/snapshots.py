"""Failure snapshots in Postgres: `session_snapshots`, partitioned by day, idempotent per (namespace, checkpoint_id).

Postgres cannot enforce UNIQUE (namespace, checkpoint_id) on a table partitioned by snapshot_at (a unique
constraint there must include the partition key), so the small unpartitioned `snapshot_ids` table
holds the uniqueness and hands out the ids. Each row holds only the events no earlier snapshot of its
session and epoch holds (`from_seq` < seq <= `to_seq`); `latest_snapshot` joins a session's rows back
into every event once. See docs/checkpoints.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import asyncpg

from memento_sessions.backends import LOCK_SCHEMA, SCHEMA_LOCK, UNANSWERED, MigratedStore, Postgres
from memento_sessions.errors import BackendUnavailable
from memento_sessions.logs import get_logger
from memento_sessions.metrics import BACKEND_ERRORS, FAILURE_SNAPSHOTS
from memento_sessions.retry import retry

log = get_logger(__name__)

# Errors after which a retry may succeed: the server is down, restarting or shutting down.
TRANSIENT: tuple[type[BaseException], ...] = (*UNANSWERED, asyncpg.OperatorInterventionError)

PARTITION_NAME = re.compile(r"^session_snapshots_p(\d{8})$")


MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, (
        """CREATE TABLE snapshot_ids (
            checkpoint_id text PRIMARY KEY,
            id bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
            snapshot_at timestamptz NOT NULL
        )""",
        "CREATE INDEX snapshot_ids_snapshot_at ON snapshot_ids (snapshot_at)",
        """CREATE TABLE session_snapshots (
            id bigint NOT NULL,
            session_id text NOT NULL,
            checkpoint_id text NOT NULL,
            namespace text NOT NULL,
            outcome text NOT NULL,
            events jsonb NOT NULL,
            snapshot_at timestamptz NOT NULL,
            PRIMARY KEY (id, snapshot_at),
            UNIQUE (checkpoint_id, snapshot_at)
        ) PARTITION BY RANGE (snapshot_at)""",
        "CREATE INDEX session_snapshots_session ON session_snapshots (namespace, session_id, snapshot_at DESC)",
    )),
    # 2: ids unique per namespace (a tenant cannot pre-empt another's), and rows that hold a seq range
    # of one epoch. Rows written by version 1 held every event of their session: from_seq 0, to_seq their
    # last seq, epoch '' (unknown); readers drop the seqs such rows repeat.
    (2, (
        "ALTER TABLE snapshot_ids ADD COLUMN namespace text",
        "UPDATE snapshot_ids i SET namespace = s.namespace FROM session_snapshots s WHERE s.id = i.id",
        "UPDATE snapshot_ids SET namespace = '' WHERE namespace IS NULL",
        "ALTER TABLE snapshot_ids ALTER COLUMN namespace SET NOT NULL",
        "ALTER TABLE snapshot_ids DROP CONSTRAINT snapshot_ids_pkey",
        "ALTER TABLE snapshot_ids ADD PRIMARY KEY (namespace, checkpoint_id)",
        "ALTER TABLE session_snapshots ADD COLUMN epoch text NOT NULL DEFAULT ''",
        "ALTER TABLE session_snapshots ADD COLUMN from_seq bigint NOT NULL DEFAULT 0",
        "ALTER TABLE session_snapshots ADD COLUMN to_seq bigint NOT NULL DEFAULT 0",
        """UPDATE session_snapshots SET to_seq = COALESCE((
            SELECT max((e->>'seq')::bigint) FROM jsonb_array_elements(events) e
            WHERE jsonb_typeof(e->'seq') = 'number'), 0)""",
        "ALTER TABLE session_snapshots DROP CONSTRAINT IF EXISTS session_snapshots_checkpoint_id_snapshot_at_key",
        "ALTER TABLE session_snapshots ADD UNIQUE (namespace, checkpoint_id, snapshot_at)",
        "CREATE INDEX session_snapshots_epoch ON session_snapshots (namespace, session_id, epoch, from_seq)",
    )),
)

# Partition names and bounds come from a `date`, never from input: DDL takes no parameters.
CREATE_PARTITION = (
    "CREATE TABLE IF NOT EXISTS {name} PARTITION OF session_snapshots "
    "FOR VALUES FROM ('{start} 00:00:00+00') TO ('{end} 00:00:00+00')"
)
DROP_PARTITION = "DROP TABLE IF EXISTS {name}"
LIST_PARTITIONS = """
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'session_snapshots'::regclass"""
FORGET_IDS = "DELETE FROM snapshot_ids WHERE snapshot_at < $1"

EXISTING_ID = "SELECT id FROM snapshot_ids WHERE namespace = $1 AND checkpoint_id = $2"
# The id is claimed and the row stored in one statement (one round trip, atomic on its own): the row is written
# only when this call claimed the id; NULL when it was claimed before (then EXISTING_ID names it, read in a
# statement of its own so that it sees a claim committed while this one waited on it).
STORE_SNAPSHOT = """
WITH claimed AS (
  INSERT INTO snapshot_ids (namespace, checkpoint_id, snapshot_at) VALUES ($3, $2, $6)
  ON CONFLICT (namespace, checkpoint_id) DO NOTHING RETURNING id
)
INSERT INTO session_snapshots (id, session_id, checkpoint_id, namespace, outcome, events, snapshot_at, epoch,
                               from_seq, to_seq)
SELECT id, $1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9 FROM claimed RETURNING id"""
COLUMNS = ("id, session_id, checkpoint_id, namespace, outcome, events::text AS events, snapshot_at, epoch, "
           "from_seq, to_seq")
LATEST_EPOCH = """
SELECT epoch FROM session_snapshots WHERE namespace = $1 AND session_id = $2
ORDER BY snapshot_at DESC, id DESC LIMIT 1"""
EPOCH_SNAPSHOTS = f"""
SELECT {COLUMNS} FROM session_snapshots WHERE namespace = $1 AND session_id = $2 AND epoch = $3
ORDER BY from_seq, to_seq, id"""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A stored failure snapshot: the events `from_seq` < seq <= `to_seq` of one session epoch."""

    id: int
    session_id: str
    checkpoint_id: str
    namespace: str
    outcome: str
    events: list[dict[str, Any]]
    snapshot_at: datetime
    epoch: str = ""
    from_seq: int = 0
    to_seq: int = 0


def partition_name(day: date) -> str:
    return f"session_snapshots_p{day:%Y%m%d}"


def partition_ddl(day: date) -> str:
    return CREATE_PARTITION.format(name=partition_name(day), start=day.isoformat(),
                                   end=(day + timedelta(days=1)).isoformat())


class Snapshots(MigratedStore):
    """The snapshot store over the daemon's (lazily connected) Postgres."""

    def __init__(self, postgres: Postgres) -> None:
        super().__init__(postgres, MIGRATIONS)

    async def migrated(self) -> None:
        """Today's and tomorrow's partitions exist before the first insert needs one."""
        today = datetime.now(UTC).date()
        await self.create_partition(today)
        await self.create_partition(today + timedelta(days=1))

    async def create_partition(self, day: date) -> None:
        """Create the partition holding `day` (UTC) if it is missing."""
        pool = await self.postgres.pool()
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(LOCK_SCHEMA, SCHEMA_LOCK)
            await conn.execute(partition_ddl(day))

    async def store_snapshot(self, namespace: str, session_id: str, checkpoint_id: str, outcome: str,
                             events: list[dict[str, Any]], snapshot_at: datetime | None = None, *,
                             epoch: str = "", from_seq: int = 0, to_seq: int | None = None) -> int:
        """Store a snapshot once per (namespace, checkpoint_id); returns its id (the same id when run again).

        `events` are the session's events after `from_seq` up to `to_seq` (default: their last seq).
        """
        await self.migrate()
        at = snapshot_at or datetime.now(UTC)
        last = to_seq if to_seq is not None else max((_seq(event) for event in events), default=from_seq)
        row = (session_id, checkpoint_id, namespace, outcome, json.dumps(events), at, epoch, from_seq, last)
        try:
            return await self._insert(*row)
        except asyncpg.CheckViolationError as exc:
            if "no partition" not in str(exc):
                raise
        await self.create_partition(at.astimezone(UTC).date())
        return await self._insert(*row)

    async def _insert(self, session_id: str, checkpoint_id: str, namespace: str, outcome: str,
                      events: str, at: datetime, epoch: str, from_seq: int, to_seq: int) -> int:
        pool = await self.postgres.pool()
        new_id: int | None = await pool.fetchval(STORE_SNAPSHOT, session_id, checkpoint_id, namespace, outcome,
                                                 events, at, epoch, from_seq, to_seq)
        if new_id is None:
            existing: int = await pool.fetchval(EXISTING_ID, namespace, checkpoint_id)
            return existing
        FAILURE_SNAPSHOTS.inc()  # counted here, where a stored row is known to be new, not on a re-run
        return new_id

    async def retry_store(self, namespace: str, session_id: str, checkpoint_id: str, outcome: str,
                          events: list[dict[str, Any]], snapshot_at: datetime | None = None, *,
                          first_delay: float = 0.1, max_delay: float = 30.0) -> int:
        """store_snapshot, retried with capped, jittered exponential backoff until Postgres answers."""
        if not self.postgres.enabled:
            raise BackendUnavailable("postgres is off (MEMENTO_POSTGRES_DSN=off): no snapshot is stored")
        at = snapshot_at or datetime.now(UTC)

        def retrying(exc: BaseException, pause: float) -> None:
            BACKEND_ERRORS.labels("postgres").inc()
            log.warning("snapshot store failed; retrying", checkpoint_id=checkpoint_id,
                        retry_in=round(pause, 3), error=repr(exc))

        return await retry(lambda: self.store_snapshot(namespace, session_id, checkpoint_id, outcome, events, at),
                           TRANSIENT, first=first_delay, cap=max_delay, retrying=retrying)

    async def drop_old_partitions(self, max_age_days: int, now: datetime | None = None) -> list[str]:
        """Drop the day partitions wholly older than `max_age_days`; returns their names."""
        await self.migrate()
        boundary = ((now or datetime.now(UTC)) - timedelta(days=max_age_days)).astimezone(UTC).date()
        pool = await self.postgres.pool()
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(LOCK_SCHEMA, SCHEMA_LOCK)
            names = sorted(row["relname"] for row in await conn.fetch(LIST_PARTITIONS))
            old = [name for name in names if (_partition_day(name) or boundary) < boundary]
            for name in old:
                await conn.execute(DROP_PARTITION.format(name=name))
            await conn.execute(FORGET_IDS, datetime.combine(boundary, time(), UTC))
        return old

    async def latest_snapshot(self, namespace: str, session_id: str) -> Snapshot | None:
        """The session's newest epoch as one snapshot: every event its rows hold, once each, in seq order
        (the bridge's fallback once Redis forgot the session); outcome and id are the newest row's."""
        rows = await self.epoch_snapshots(namespace, session_id)
        if not rows:
            return None
        newest = max(rows, key=lambda row: (row.snapshot_at, row.id))
        return replace(newest, events=join_events(rows), from_seq=min(row.from_seq for row in rows),
                       to_seq=max(row.to_seq for row in rows))

    async def epoch_snapshots(self, namespace: str, session_id: str, epoch: str | None = None) -> list[Snapshot]:
        """The rows of one epoch of a session (default: its newest), in seq order."""
        await self.migrate()
        pool = await self.postgres.pool()
        if epoch is None:
            epoch = await pool.fetchval(LATEST_EPOCH, namespace, session_id)
            if epoch is None:
                return []
        rows = await pool.fetch(EPOCH_SNAPSHOTS, namespace, session_id, epoch)
        return [Snapshot(row["id"], row["session_id"], row["checkpoint_id"], row["namespace"], row["outcome"],
                         json.loads(row["events"]), row["snapshot_at"], row["epoch"], row["from_seq"],
                         row["to_seq"]) for row in rows]


def join_events(rows: list[Snapshot]) -> list[dict[str, Any]]:
    """The events of `rows`, each seq once, in seq order (a row stored again after a crash may repeat some)."""
    by_seq: dict[int, dict[str, Any]] = {}
    for row in rows:
        for event in row.events:
            by_seq.setdefault(_seq(event), event)
    return [by_seq[seq] for seq in sorted(by_seq)]


def _seq(event: dict[str, Any]) -> int:
    value = event.get("seq")
    return value if isinstance(value, int) else 0  # the server sets every stored event's seq


def _partition_day(name: str) -> date | None:
    """The day a partition holds; None for a table that is not one of our day partitions."""
    match = PARTITION_NAME.match(name)
    return None if match is None else datetime.strptime(match.group(1), "%Y%m%d").date()
