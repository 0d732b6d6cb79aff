"""Suspended sessions in Postgres: `suspended_sessions`, one row per (namespace, session id), and its
events, ids and snapshots in `suspended_chunks`, one row per chunk.

A suspended session is moved out of Redis whole and exact: its hash, agents, ids (with its compaction
snapshots) and every stored event, so a resume writes back the same seqs. Its events are stored in chunks
of at most MEMENTO_SUSPEND_CHUNK_BYTES (plus one event), its client ids likewise, and each compaction
snapshot in a row of its own: no single value nears Postgres's 256 MB jsonb (or 1 GB text) ceiling,
and a page of a stored session reads only the chunks it needs. An events chunk is read back split into its
events by Postgres, a row each, never as one string. Rows of the first schema version keep
their events and ids inline (`chunked` false) and are read as before.

A row's `status` says what it is: `suspending` (written, Redis not yet known to have let the session go),
`suspended`, `resuming` (being written back into Redis), `completed` (a completed session's copy, kept
while Redis holds it for its grace TTL, and after), `archived`. A row found `suspending` or `resuming`
with no live copy in Redis may be older than a live copy that expired since: it is revived under a new
epoch, so no seq is ever reused in an epoch (docs/lifecycle.md). An upsert only replaces a row of the
same epoch and an older seq (or a row being resumed, which Redis holds again): a stored session is never
replaced by another epoch's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memento_sessions.backends import MigratedStore, Migration, Postgres
from memento_sessions.errors import Conflict, Reason
from memento_sessions.sessions.paging import seq_of

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    Connection = PoolConnectionProxy[asyncpg.Record]

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
    (102, (
        "ALTER TABLE suspended_sessions ADD COLUMN chunked boolean NOT NULL DEFAULT false",
        """CREATE TABLE suspended_chunks (
            namespace text NOT NULL,
            session_id text NOT NULL,
            kind text NOT NULL,
            part bigint NOT NULL,
            last_seq bigint NOT NULL,
            body text NOT NULL,
            PRIMARY KEY (namespace, session_id, kind, part)
        )""",
    )),
)

EVENTS, IDS, SNAPSHOT = "e", "i", "s"  # chunk kinds: events (newline-separated members), ids, one snapshot
LIVE_STATUSES = ("suspending", "suspended", "resuming")  # rows that stand for a session not completed

CLAIM = """
INSERT INTO suspended_sessions (namespace, session_id, epoch, seq, status, state, fields, agents, ids, events,
                                summary, suspended_at, chunked)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, '{}'::jsonb, NULL, '{}'::jsonb, $9, true)
ON CONFLICT (namespace, session_id) DO UPDATE SET
    epoch = EXCLUDED.epoch, seq = EXCLUDED.seq, status = EXCLUDED.status, state = EXCLUDED.state,
    fields = EXCLUDED.fields, agents = EXCLUDED.agents, ids = EXCLUDED.ids, events = NULL,
    summary = EXCLUDED.summary, suspended_at = EXCLUDED.suspended_at, chunked = true
WHERE (suspended_sessions.epoch = EXCLUDED.epoch AND suspended_sessions.seq <= EXCLUDED.seq
       AND suspended_sessions.status <> 'archived') OR suspended_sessions.status = 'resuming'
RETURNING true"""
HELD = "SELECT status, epoch FROM suspended_sessions WHERE namespace = $1 AND session_id = $2"
DROP_CHUNKS = "DELETE FROM suspended_chunks WHERE namespace = $1 AND session_id = $2"
ADD_CHUNK = """INSERT INTO suspended_chunks (namespace, session_id, kind, part, last_seq, body)
VALUES ($1, $2, $3, $4, $5, $6)"""
SET_SUMMARY = "UPDATE suspended_sessions SET summary = $3::jsonb WHERE namespace = $1 AND session_id = $2"
SELECT_ONE = """
SELECT namespace, session_id, epoch, seq, status, state, fields::text, agents::text,
       CASE WHEN chunked THEN NULL ELSE ids::text END, CASE WHEN chunked THEN NULL ELSE events::text END,
       summary::text, suspended_at, chunked
FROM suspended_sessions WHERE namespace = $1 AND session_id = $2"""
STATUS_OF = "SELECT status FROM suspended_sessions WHERE namespace = $1 AND session_id = $2"
MARK = """UPDATE suspended_sessions SET status = $5
WHERE namespace = $1 AND session_id = $2 AND epoch = $3 AND seq = $4 AND status = ANY($6::text[])
RETURNING true"""
DELETE_RESUMED = """
WITH gone AS (DELETE FROM suspended_sessions WHERE namespace = $1 AND session_id = $2 AND epoch = $3
              AND seq = $4 AND status = 'resuming' RETURNING namespace, session_id)
DELETE FROM suspended_chunks c USING gone g WHERE c.namespace = g.namespace AND c.session_id = g.session_id"""
# The next events chunk split into its members by Postgres, a row each (with its place in the chunk): the daemon
# never holds a chunk's body as one string, nor the driver one message of a chunk's size (docs/lifecycle.md).
NEXT_EVENTS = """
SELECT m.n, m.member FROM (
    SELECT body FROM suspended_chunks WHERE namespace = $1 AND session_id = $2 AND kind = 'e' AND last_seq > $3
    ORDER BY part LIMIT 1) c
CROSS JOIN LATERAL unnest(string_to_array(c.body, E'\\n')) WITH ORDINALITY AS m(member, n)"""
IDS_CHUNK = """
SELECT part, body FROM suspended_chunks WHERE namespace = $1 AND session_id = $2 AND kind = 'i' AND part > $3
ORDER BY part LIMIT 1"""
SNAPSHOT_AT = """
SELECT part, body FROM suspended_chunks WHERE namespace = $1 AND session_id = $2 AND kind = 's' AND part <= $3
ORDER BY part DESC LIMIT 1"""
SNAPSHOT_SEQS = """
SELECT part FROM suspended_chunks WHERE namespace = $1 AND session_id = $2 AND kind = 's' ORDER BY part"""
LIST_PAGE = """
SELECT session_id, epoch, seq, status, state, fields::text, agents::text, suspended_at FROM suspended_sessions
WHERE namespace = $1 AND ($2::text IS NULL OR status = $2
                          OR ($2 = 'suspended' AND status IN ('suspending', 'resuming')))
  AND suspended_at < $3
ORDER BY suspended_at DESC LIMIT $4"""
FORGET = """
WITH gone AS (DELETE FROM suspended_sessions WHERE namespace = $1 AND session_id = $2
              RETURNING namespace, session_id),
     chunks AS (DELETE FROM suspended_chunks c USING gone g
                WHERE c.namespace = g.namespace AND c.session_id = g.session_id)
SELECT count(*) FROM gone"""
STORED_AMONG = "SELECT session_id FROM suspended_sessions WHERE namespace = $1 AND session_id = ANY($2::text[])"
ARCHIVE_OLD = """
WITH gone AS (UPDATE suspended_sessions SET status = 'archived', events = NULL, ids = '{}'::jsonb
              WHERE status IN ('suspending', 'suspended', 'resuming', 'completed') AND suspended_at < $1
              RETURNING namespace, session_id),
     chunks AS (DELETE FROM suspended_chunks c USING gone g
                WHERE c.namespace = g.namespace AND c.session_id = g.session_id)
SELECT count(*) FROM gone"""


@dataclass(frozen=True, slots=True)
class Suspended:
    """One stored session: what Redis held when it was suspended (its events and ids read apart, in chunks,
    unless `chunked` is false: a row of the first schema, which holds them inline)."""

    namespace: str
    session_id: str
    epoch: str
    seq: int
    status: str
    state: str
    fields: dict[str, str]
    agents: list[str]
    ids: dict[str, str]  # inline ids (rows of the first schema only)
    events: list[str] | None  # inline events (first schema only); None once archived or when chunked
    summary: dict[str, Any]
    suspended_at: datetime
    chunked: bool = True

    @property
    def archived(self) -> bool:
        return self.status == "archived"


class RowWriter:
    """Writes one stored session's chunks inside the transaction that claimed its row: events and ids are
    buffered up to `chunk_bytes` (plus one item) and written as one row each, snapshots one row apiece."""

    def __init__(self, conn: Connection, namespace: str, session_id: str, chunk_bytes: int) -> None:
        self.conn, self.namespace, self.session_id, self.chunk_bytes = conn, namespace, session_id, chunk_bytes
        self.parts = {EVENTS: 0, IDS: 0}
        self._events: list[str] = []
        self._ids: list[tuple[str, str]] = []
        self._event_bytes = self._id_bytes = 0

    async def events(self, members: list[str]) -> None:
        """Add stored members, in seq order."""
        for member in members:
            if "\n" in member:  # members are compact JSON: a raw newline would split one in two
                raise ValueError("a stored event holds a raw newline")
            self._events.append(member)
            self._event_bytes += len(member)
            if self._event_bytes >= self.chunk_bytes:
                await self._flush_events()

    async def ids(self, pairs: list[tuple[str, str]]) -> None:
        """Add client id -> seq pairs (and the session's other ids-hash fields)."""
        for pair in pairs:
            self._ids.append(pair)
            self._id_bytes += len(pair[0]) + len(pair[1]) + 8
            if self._id_bytes >= self.chunk_bytes:
                await self._flush_ids()

    async def snapshot(self, seq: int, data: str) -> None:
        """Store one compaction snapshot."""
        await self.conn.execute(ADD_CHUNK, self.namespace, self.session_id, SNAPSHOT, seq, seq, data)

    async def finish(self, summary: dict[str, Any]) -> None:
        """Write what is buffered and the row's summary."""
        await self._flush_events()
        await self._flush_ids()
        await self.conn.execute(SET_SUMMARY, self.namespace, self.session_id, json.dumps(summary))

    async def _flush_events(self) -> None:
        if not self._events:
            return
        self.parts[EVENTS] += 1
        await self.conn.execute(ADD_CHUNK, self.namespace, self.session_id, EVENTS, self.parts[EVENTS],
                                seq_of(self._events[-1]), "\n".join(self._events))
        self._events, self._event_bytes = [], 0

    async def _flush_ids(self) -> None:
        if not self._ids:
            return
        self.parts[IDS] += 1
        await self.conn.execute(ADD_CHUNK, self.namespace, self.session_id, IDS, self.parts[IDS], 0,
                                json.dumps(self._ids))
        self._ids, self._id_bytes = [], 0


class SuspendedStore(MigratedStore):
    """The `suspended_sessions` table and its chunks."""

    def __init__(self, postgres: Postgres, chunk_bytes: int = 4 * 1024 * 1024) -> None:
        super().__init__(postgres, MIGRATIONS)
        self.chunk_bytes = chunk_bytes

    @asynccontextmanager
    async def write(self, head: Suspended) -> AsyncIterator[RowWriter]:
        """Store (or refresh) a session: claims its row with `head` (its events, ids and summary are written
        through the RowWriter), all in one transaction. Conflict (reason: the stored row's status) when the
        row holds another epoch's session, or a newer copy of this one."""
        await self.migrate()
        pool = await self.postgres.pool()
        async with pool.acquire() as conn, conn.transaction():
            claimed = await conn.fetchval(CLAIM, head.namespace, head.session_id, head.epoch, head.seq, head.status,
                                          head.state, json.dumps(head.fields), json.dumps(head.agents),
                                          head.suspended_at)
            if not claimed:
                held = await conn.fetchrow(HELD, head.namespace, head.session_id)
                status = held[0] if held else "suspended"
                raise Conflict(f"Postgres holds another copy of session {head.session_id!r} ({status})",
                               {"reason": Reason.SUSPENDED if status in LIVE_STATUSES else status})
            await conn.execute(DROP_CHUNKS, head.namespace, head.session_id)
            writer = RowWriter(conn, head.namespace, head.session_id, self.chunk_bytes)
            yield writer

    async def get(self, namespace: str, session_id: str) -> Suspended | None:
        """The stored session's row, if any (a chunked row's events and ids are read apart)."""
        await self.migrate()
        pool = await self.postgres.pool()
        rec = await pool.fetchrow(SELECT_ONE, namespace, session_id)
        if rec is None:
            return None
        return Suspended(rec[0], rec[1], rec[2], rec[3], rec[4], rec[5], json.loads(rec[6]), json.loads(rec[7]),
                         json.loads(rec[8]) if rec[8] else {}, json.loads(rec[9]) if rec[9] else None,
                         json.loads(rec[10]), rec[11], rec[12])

    async def status(self, namespace: str, session_id: str) -> str | None:
        """The stored row's status, or None when Postgres holds no session by that id."""
        await self.migrate()
        pool = await self.postgres.pool()
        found: str | None = await pool.fetchval(STATUS_OF, namespace, session_id)
        return found

    async def mark(self, row: Suspended, status: str, among: tuple[str, ...]) -> bool:
        """Set the row's status if it is still that copy (epoch and seq) with a status `among`."""
        pool = await self.postgres.pool()
        return bool(await pool.fetchval(MARK, row.namespace, row.session_id, row.epoch, row.seq, status, list(among)))

    async def events(self, row: Suspended, after: int, upto: int | None = None) -> AsyncIterator[list[str]]:
        """The row's stored members with `after` < seq (<= `upto`), a chunk at a time."""
        if not row.chunked:
            members = row.events or []
            for start in range(0, len(members), 1000):
                chunk = [m for m in members[start:start + 1000]
                         if after < seq_of(m) and (upto is None or seq_of(m) <= upto)]
                if chunk:
                    yield chunk
            return
        pool = await self.postgres.pool()
        cursor = after
        while upto is None or cursor < upto:
            rows = await pool.fetch(NEXT_EVENTS, row.namespace, row.session_id, cursor)
            if not rows:
                return
            members = [rec[1] for rec in sorted(rows, key=lambda rec: int(rec[0]))]
            cursor = seq_of(members[-1])
            chunk = [m for m in members if after < seq_of(m) and (upto is None or seq_of(m) <= upto)]
            if chunk:
                yield chunk

    async def ids(self, row: Suspended) -> AsyncIterator[list[tuple[str, str]]]:
        """The row's ids-hash fields other than snapshots, a chunk at a time."""
        if not row.chunked:
            yield [(k, v) for k, v in row.ids.items() if not k.startswith("~snap")]
            return
        pool = await self.postgres.pool()
        part = 0
        while rec := await pool.fetchrow(IDS_CHUNK, row.namespace, row.session_id, part):
            part = rec[0]
            yield [(k, v) for k, v in json.loads(rec[1])]

    async def snapshot_at(self, row: Suspended, at_seq: int) -> tuple[int, str] | None:
        """The row's newest snapshot at or before `at_seq`, as (seq, data), if any."""
        if not row.chunked:
            seqs = [int(s) for s in (row.ids.get("~snaps") or "").split() if int(s) <= at_seq]
            return (max(seqs), row.ids[f"~snap:{max(seqs)}"]) if seqs else None
        pool = await self.postgres.pool()
        rec = await pool.fetchrow(SNAPSHOT_AT, row.namespace, row.session_id, at_seq)
        return (int(rec[0]), str(rec[1])) if rec else None

    async def snapshot_seqs(self, row: Suspended) -> list[int]:
        """The seqs of the row's snapshots, in order."""
        if not row.chunked:
            return [int(s) for s in (row.ids.get("~snaps") or "").split()]
        pool = await self.postgres.pool()
        return [int(rec[0]) for rec in await pool.fetch(SNAPSHOT_SEQS, row.namespace, row.session_id)]

    async def resumed(self, row: Suspended) -> None:
        """Forget the stored copy once Redis holds it again (only that copy: a newer suspend stays)."""
        pool = await self.postgres.pool()
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(DELETE_RESUMED, row.namespace, row.session_id, row.epoch, row.seq)

    async def forget(self, namespace: str, session_id: str) -> bool:
        """Delete a stored session (session.clear); True when there was one."""
        await self.migrate()
        pool = await self.postgres.pool()
        return bool(await pool.fetchval(FORGET, namespace, session_id))

    async def page(self, namespace: str, status: str | None, before: datetime, limit: int) -> list[dict[str, Any]]:
        """Stored sessions of a namespace, newest suspension first, suspended before `before` (`suspended`
        includes the rows caught mid-move: the caller leaves out those Redis holds)."""
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
        """Stored sessions past retention become archived: events dropped, summary kept."""
        await self.migrate()
        pool = await self.postgres.pool()
        return int(await pool.fetchval(ARCHIVE_OLD, older_than))
