"""JSON-RPC methods of the lifecycle (session.fork, .suspend, .resume, .clear), and its background work
(suspending idle sessions, archiving old ones). Event sourcing's (session.diff, .snapshot, .compact) are in
history/methods.py, over the `History` built here.

It also holds the lifecycle's variants of three methods of `methods.py`, which api/ declares in their place:
`session.get {atSeq}`, `session.list {status}` and `session.create {onIdle}`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import anyio
import asyncpg
from pydantic import Field
from redis.exceptions import RedisError

from memento_sessions import keys
from memento_sessions.backends import UNANSWERED, Backends
from memento_sessions.errors import InvalidParams, MementoError, NotFound, RateLimited, Reason
from memento_sessions.history.views import History
from memento_sessions.lifecycle.fork import fork
from memento_sessions.lifecycle.moves import Lifecycle
from memento_sessions.lifecycle.postgres import Suspended, SuspendedStore
from memento_sessions.lifecycle.reads import stored_at, stored_condensed, stored_get, stored_session
from memento_sessions.logs import get_logger, one_pass
from memento_sessions.metrics import LIFECYCLE
from memento_sessions.rpc import Call, Result
from memento_sessions.sessions.janitor import lifecycle_candidates
from memento_sessions.sessions.manager import IDLE_MARGIN, SessionManager
from memento_sessions.sessions.methods import CreateParams, GetParams, ListParams, SessionMethods, SessionParams
from memento_sessions.sessions.models import ClientId, Seq
from memento_sessions.sessions.paging import PAGE, page_bytes
from memento_sessions.usage.query import session_totals

Status = Literal["active", "suspended", "completed", "archived"]
LIVE_CURSOR = re.compile(r"[0-9]{1,16}:[A-Za-z0-9._:-]{1,128}")  # session.list's own cursor (methods.ListCursor)
IDLE_EVERY = 15.0  # seconds between idle-suspend passes
ARCHIVE_EVERY = 600.0  # seconds between archive passes
# What ends one idle/archive pass without ending the loop: ours, and any error a backend's driver raises.
PASS_ERRORS: tuple[type[BaseException], ...] = (MementoError, *UNANSWERED, asyncpg.PostgresError, RedisError)
# What one session's idle suspend may fail with (the others' go on): the above, and what the Postgres
# driver refuses to send or a stored value refuses to be.
SUSPEND_ERRORS: tuple[type[BaseException], ...] = (*PASS_ERRORS, asyncpg.InterfaceError, ValueError)
log = get_logger(__name__)


class Heavy:
    """At most `limit` heavy requests at once in this daemon (a fork, suspend or resume, a read of a stored
    session): each streams a session a chunk at a time, and this bounds how many chunks are held at once.
    One past the limit is refused at once with -32029 and `retryAfterMs`, writing nothing."""

    def __init__(self, limit: int) -> None:
        self.limit, self.running = limit, 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self.running >= self.limit:
            LIFECYCLE.labels("heavy_refused").inc()
            raise RateLimited(f"{self.running} heavy requests (fork, suspend, resume, stored reads) running; "
                              f"at most {self.limit} (MEMENTO_HEAVY_MAX)",
                              {"retryAfterMs": 1000, "reason": Reason.BUSY})
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1


class GetAtParams(GetParams):
    atSeq: Seq | None = None


class ListStatusParams(ListParams):
    status: Status | None = None
    cursor: str | None = Field(default=None, max_length=160)  # a session.list cursor, or a suspension time (ms)


class CreateIdleParams(CreateParams):
    onIdle: Literal["expire", "suspend"] | None = None


class ForkParams(SessionParams):
    atSeq: Seq
    newSessionId: ClientId | None = None


class LifecycleService:
    """The Lifecycle (and the History its stored reads fold through) over the manager, their methods, and the
    idle/archive loop."""

    def __init__(self, manager: SessionManager, backends: Backends) -> None:
        self.manager, self.settings = manager, manager.settings
        self.suspended = SuspendedStore(backends.postgres, manager.settings.suspend_chunk_bytes)
        self.history = History(manager, backends.postgres.enabled)
        self.lifecycle = Lifecycle(manager, self.suspended)
        self.heavy = Heavy(manager.settings.heavy_max)
        self.plain = SessionMethods(manager)  # session.create without onIdle

    async def run(self) -> None:
        """Suspend idle `onIdle: suspend` sessions before Redis would expire them, copy completed ones to
        Postgres before their grace TTL runs out, archive old ones."""
        last_archive = 0.0
        while True:
            await self._guarded(self.move)
            if anyio.current_time() - last_archive > ARCHIVE_EVERY and self.manager.settings.postgres_enabled:
                last_archive = anyio.current_time()
                await self._guarded(self.archive)
            await anyio.sleep(IDLE_EVERY)

    async def move(self) -> tuple[int, int]:
        """One lifecycle pass: (idle sessions suspended, completed sessions copied to Postgres).

        Each session's suspend stands alone: one that fails is logged (no traceback), its keys get another
        IDLE_MARGIN so Redis does not expire it before the next pass tries again, and the sessions after it
        are still suspended.
        """
        found = await lifecycle_candidates(self.manager.redis, int(IDLE_MARGIN * 1000))
        suspended = 0
        for namespace, session_id in found.idle:
            try:
                await self.lifecycle.suspend(namespace, session_id)
                suspended += 1
            except SUSPEND_ERRORS as exc:
                await self._suspend_failed(namespace, session_id, exc)
        return suspended, await self.keep_completed(found.completed)

    async def _suspend_failed(self, namespace: str, session_id: str, exc: BaseException) -> None:
        """Keep a session whose idle suspend (or completed copy) failed alive until a later pass (IDLE_MARGIN
        more), and say so."""
        LIFECYCLE.labels("suspend_failed").inc()
        log.warning("moving the session to Postgres failed; kept in Redis, retried next pass", namespace=namespace,
                    sessionId=session_id, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        skeys = keys.session_keys(namespace, session_id)
        try:
            async with self.manager.redis.pipeline(transaction=False) as pipe:
                for key in skeys.all():
                    pipe.expire(key, IDLE_MARGIN, gt=True)
                await pipe.execute()
        except PASS_ERRORS as again:
            log.warning("could not extend the session's TTL", namespace=namespace, sessionId=session_id,
                        error=f"{type(again).__name__}: {str(again)[:200]}")

    async def keep_completed(self, completed: list[tuple[str, str]]) -> int:
        """Copy the completed sessions Postgres does not hold yet; returns how many were copied.

        Every daemon may copy the same session in the same pass: the upsert stores one row either way.
        """
        if not self.settings.postgres_enabled:
            return 0
        kept = 0
        for namespace, ids in group_by_namespace(completed).items():
            stored = await self.suspended.stored_among(namespace, ids)
            for session_id in ids:
                if session_id in stored:
                    continue
                try:
                    kept += await self.lifecycle.keep_completed(namespace, session_id)
                except SUSPEND_ERRORS as exc:  # this session's copy failed; the others' go on
                    await self._suspend_failed(namespace, session_id, exc)
        return kept

    async def _guarded(self, job: Callable[[], Awaitable[object]]) -> None:
        """Run one pass; a backend that fails it (Postgres shutting down or cutting the connection mid-query,
        a Redis or Cluster error) is a warning, anything else a logged bug, and the next pass tries again:
        it must not stop the daemon."""
        await one_pass(job, f"lifecycle {getattr(job, '__name__', 'pass')}", PASS_ERRORS)

    async def archive(self, now: datetime | None = None) -> int:
        """Suspended and completed sessions older than MEMENTO_ARCHIVE_AFTER_DAYS (at `now`, default the
        clock's) become archived; returns how many. Idempotent: several daemons may run it at once."""
        cutoff = (now or datetime.now(UTC)) - timedelta(days=self.settings.archive_after_days)
        archived = await self.suspended.archive(cutoff)
        LIFECYCLE.labels("archived").inc(archived)
        return archived

    async def list_sessions(self, namespace: str, p: ListStatusParams) -> Result:
        """session.list with `status`: live ones from Redis, suspended/archived ones from Postgres."""
        if p.status in ("suspended", "archived") or (p.status == "completed" and p.cursor and p.cursor.isdigit()):
            return await self._stored(namespace, p, p.limit)
        if p.cursor is not None and not LIVE_CURSOR.fullmatch(p.cursor):
            raise InvalidParams("invalid params", [{"field": "cursor", "message": "not a cursor of this listing"}])
        state = "completed" if p.status == "completed" else p.state
        result = await self.manager.list_sessions(namespace, state=state, agent_id=p.agentId, limit=p.limit,
                                                  cursor=p.cursor)
        if p.status == "active":
            result["sessions"] = [s for s in result["sessions"] if s["status"] == "active"]
        if p.status == "completed" and "nextCursor" not in result and self.settings.postgres_enabled:
            # Redis is listed through: the completed sessions its grace TTL let go follow, from Postgres.
            more = await self._stored(namespace, p.model_copy(update={"cursor": None}),
                                      p.limit - len(result["sessions"]))
            result["sessions"] += more["sessions"]
            result.update({k: v for k, v in more.items() if k == "nextCursor"})
        return result

    async def _stored(self, namespace: str, p: ListStatusParams, limit: int) -> Result:
        """A page of the sessions Postgres holds with status `p.status`; completed ones Redis still holds are
        left out (the live part of the listing has them)."""
        try:
            before = datetime.fromtimestamp(int(p.cursor) / 1000, UTC) if p.cursor else datetime.now(UTC)
        except (ValueError, OverflowError, OSError):
            raise InvalidParams("invalid params", [{"field": "cursor", "message": "not a cursor of this "
                                                    "listing"}]) from None
        if limit < 1:  # the live part filled the page: the stored part starts on the next one
            return {"sessions": [], "nextCursor": str(int(before.timestamp() * 1000))}
        rows = await self.suspended.page(namespace, p.status, before, limit + 1)
        # Completed rows of sessions Redis still holds, and rows a crash caught mid-move whose live copy
        # is the authority, are listed by the live part.
        listed = await self._live(namespace, [row["sessionId"] for row in rows[:limit]]) \
            if p.status in ("completed", "suspended") else set()
        retention = timedelta(days=self.settings.archive_after_days)
        wanted = [row for row in rows[:limit] if (p.agentId is None or p.agentId in row["agentIds"])
                  and row["sessionId"] not in listed]
        sessions = [stored_session(row["sessionId"], row["status"], row["fields"], row["agentIds"], row["suspendedAt"],
                                   retention) for row in wanted]
        result: dict[str, Any] = {"sessions": sessions}
        if len(rows) > limit:
            result["nextCursor"] = str(int(rows[limit - 1]["suspendedAt"].timestamp() * 1000))
        return result

    async def _live(self, namespace: str, session_ids: list[str]) -> set[str]:
        """Which of `session_ids` Redis still holds (one round trip; on a cluster their slots differ)."""
        async with self.manager.redis.pipeline(transaction=False) as pipe:
            for session_id in session_ids:
                pipe.exists(keys.session_keys(namespace, session_id).session)
            found = await pipe.execute()
        return {sid for sid, exists in zip(session_ids, found, strict=True) if exists}

    async def create(self, call: Call, p: CreateIdleParams) -> Result:
        if p.sessionId is None:
            return await self.create_new(call, p)
        namespace = call.identity.namespace
        await self.lifecycle.refuse_stored(namespace, p.sessionId)
        created = await self.create_new(call, p)
        # A suspend of the id's old session may have completed between the check and the create.
        await self.lifecycle.withdraw_if_stored(namespace, p.sessionId, created["epoch"])
        return created

    async def create_new(self, call: Call, p: CreateIdleParams) -> Result:
        if (p.onIdle or self.settings.on_idle) != "suspend":
            return await self.plain.create(call, p)
        if p.ttl is not None and p.ttl > self.settings.session_ttl:
            raise InvalidParams("invalid params", [{"field": "ttl", "message": f"at most {self.settings.session_ttl} "
                                                    "(MEMENTO_SESSION_TTL)"}])
        return await self.manager.create(call.identity, entity_ids=p.entityIds, session_id=p.sessionId, ttl=p.ttl,
                                         labels=p.labels, on_idle="suspend")

    async def get(self, call: Call, p: GetAtParams) -> Result:
        namespace = call.identity.namespace
        try:
            if p.atSeq is not None:
                return await self.history.get_at(namespace, p.sessionId, p.atSeq)
            if p.condensed:
                return await self._condensed(namespace, p.sessionId)
            return await self.manager.get(namespace, p.sessionId, condensed=p.condensed, since=p.since,
                                          limit=p.limit)
        except NotFound:
            row = await self.suspended.get(namespace, p.sessionId) if self.settings.postgres_enabled else None
            if row is None:
                raise
        async with self.heavy.slot():
            return await self.get_stored(row, p)

    async def _condensed(self, namespace: str, session_id: str) -> Result:
        """The live condensed view; once compacted, its reducer part is the snapshot plus the events after (the
        manager folds only the events Redis still holds, which would drop the compacted ones from the counts)."""
        result = await self.manager.get(namespace, session_id, condensed=True)
        if result["session"].get("compactedSeq"):
            _, folder = await self.history.fold(namespace, session_id, result["session"]["seq"])
            result.update(folder.result())
        return result

    async def get_stored(self, row: Suspended, p: GetAtParams) -> Result:
        """session.get of a session Redis no longer holds but Postgres does (suspended, completed, archived)."""
        retention = timedelta(days=self.settings.archive_after_days)
        if p.atSeq is not None:
            return await stored_at(self.suspended, row, retention, p.atSeq)
        if p.condensed:
            result = await stored_condensed(self.suspended, row, retention)
            if "usage" not in result:  # a row stored without its usage: Redis's, while its keys live
                result["usage"] = (await session_totals(self.manager.redis, row.namespace, row.session_id))["totals"]
            return result
        return await stored_get(self.suspended, row, retention, p.since, p.limit or PAGE,
                                page_bytes(self.settings.ws_send_buffer))

    async def list_(self, call: Call, p: ListStatusParams) -> Result:
        return await self.list_sessions(call.identity.namespace, p)

    async def fork(self, call: Call, p: ForkParams) -> Result:
        async with self.heavy.slot():
            return await fork(self.lifecycle, call.identity, p.sessionId, p.atSeq, p.newSessionId)

    async def suspend(self, call: Call, p: SessionParams) -> Result:
        async with self.heavy.slot():
            return await self.lifecycle.suspend(call.identity.namespace, p.sessionId)

    async def resume(self, call: Call, p: SessionParams) -> Result:
        async with self.heavy.slot():
            return await self.lifecycle.resume(call.identity.namespace, p.sessionId)

    async def clear(self, call: Call, p: SessionParams) -> Result:
        return await self.lifecycle.clear(call.identity.namespace, p.sessionId)


def group_by_namespace(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """(namespace, session id) pairs as the session ids of each namespace."""
    grouped: dict[str, list[str]] = {}
    for namespace, session_id in pairs:
        grouped.setdefault(namespace, []).append(session_id)
    return grouped
