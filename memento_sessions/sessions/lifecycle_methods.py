"""JSON-RPC methods of event sourcing and the lifecycle (session.diff, .snapshot, .compact, .fork, .suspend,
.resume), and the lifecycle's background work (suspending idle sessions, archiving old ones).

It also extends three methods of `methods.py` with their section-11 parameters, registering them again
over the same handlers: `session.get {atSeq}`, `session.list {status}` and `session.create {onIdle}`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import anyio
import asyncpg
import pydantic_core
from pydantic import Field
from redis.exceptions import RedisError

from memento_sessions.backends import UNANSWERED, Backends
from memento_sessions.errors import InvalidParams, MementoError
from memento_sessions.logs import get_logger
from memento_sessions.rpc import Call, Registry, Result
from memento_sessions.sessions.history import History
from memento_sessions.sessions.janitor import idle_sessions
from memento_sessions.sessions.lifecycle import Lifecycle
from memento_sessions.sessions.manager import IDLE_MARGIN, SessionManager, iso
from memento_sessions.sessions.methods import CreateParams, GetParams, ListParams, SessionParams
from memento_sessions.sessions.models import ClientId, Seq
from memento_sessions.sessions.suspended import SuspendedStore

log = get_logger(__name__)
Status = Literal["active", "suspended", "completed", "archived"]
LIVE_CURSOR = re.compile(r"[0-9]{1,16}:[A-Za-z0-9._:-]{1,128}")  # session.list's own cursor (methods.ListCursor)
IDLE_EVERY = 15.0  # seconds between idle-suspend passes
ARCHIVE_EVERY = 600.0  # seconds between archive passes
# What ends one idle/archive pass without ending the loop: ours, and any error a backend's driver raises.
PASS_ERRORS: tuple[type[BaseException], ...] = (MementoError, *UNANSWERED, asyncpg.PostgresError, RedisError)


class GetAtParams(GetParams):
    atSeq: Seq | None = None


class ListStatusParams(ListParams):
    status: Status | None = None
    cursor: str | None = Field(default=None, max_length=160)  # a session.list cursor, or a suspension time (ms)


class CreateIdleParams(CreateParams):
    onIdle: Literal["expire", "suspend"] | None = None


class DiffParams(SessionParams):
    fromSeq: Seq
    toSeq: Seq


class CompactParams(SessionParams):
    beforeSeq: Seq | None = Field(default=None, ge=1)


class ForkParams(SessionParams):
    atSeq: Seq
    newSessionId: ClientId | None = None


class LifecycleService:
    """History and Lifecycle over the manager, their methods, and the idle/archive loop."""

    def __init__(self, manager: SessionManager, backends: Backends) -> None:
        self.manager, self.settings = manager, manager.settings
        self.suspended = SuspendedStore(backends.postgres)
        self.history = History(manager, backends.postgres.enabled)
        self.lifecycle = Lifecycle(manager, self.suspended)

    async def run(self) -> None:
        """Suspend idle `onIdle: suspend` sessions before Redis would expire them; archive old ones."""
        last_archive = 0.0
        while True:
            await self._guarded(self.suspend_idle)
            if anyio.current_time() - last_archive > ARCHIVE_EVERY and self.manager.settings.postgres_enabled:
                last_archive = anyio.current_time()
                await self._guarded(self.archive)
            await anyio.sleep(IDLE_EVERY)

    async def _guarded(self, job: Any) -> None:
        """Run one pass; a backend that fails it (Postgres shutting down or cutting the connection mid-query,
        a Redis or Cluster error) is logged and the next pass tries again: it must not stop the daemon."""
        try:
            await job()
        except PASS_ERRORS as exc:
            log.warning("lifecycle pass failed", job=job.__name__, error=repr(exc))

    async def suspend_idle(self) -> int:
        """Suspend every onIdle=suspend session whose TTL is about to run out; returns how many."""
        done = 0
        for namespace, session_id in await idle_sessions(self.manager.redis, int(IDLE_MARGIN * 1000)):
            await self.lifecycle.suspend(namespace, session_id)
            done += 1
        return done

    async def archive(self) -> int:
        """Suspended sessions older than MEMENTO_ARCHIVE_AFTER_DAYS become archived."""
        cutoff = datetime.now(UTC) - timedelta(days=self.settings.archive_after_days)
        return await self.suspended.archive(cutoff)

    async def list_sessions(self, namespace: str, p: ListStatusParams) -> Result:
        """session.list with `status`: live ones from Redis, suspended/archived ones from Postgres."""
        if p.status in ("suspended", "archived"):
            return await self._stored(namespace, p)
        if p.cursor is not None and not LIVE_CURSOR.fullmatch(p.cursor):
            raise InvalidParams("invalid params", [{"field": "cursor", "message": "not a cursor of this listing"}])
        state = "completed" if p.status == "completed" else p.state
        result = await self.manager.list_sessions(namespace, state=state, agent_id=p.agentId, limit=p.limit,
                                                  cursor=p.cursor)
        if p.status == "active":
            result["sessions"] = [s for s in result["sessions"] if s["status"] == "active"]
        return result

    async def _stored(self, namespace: str, p: ListStatusParams) -> Result:
        try:
            before = datetime.fromtimestamp(int(p.cursor) / 1000, UTC) if p.cursor else datetime.now(UTC)
        except (ValueError, OverflowError, OSError):
            raise InvalidParams("invalid params", [{"field": "cursor", "message": "not a cursor of this "
                                                    "listing"}]) from None
        rows = await self.suspended.page(namespace, p.status, before, p.limit + 1)
        sessions = [stored_view(row) for row in rows[: p.limit] if p.agentId is None or p.agentId in row["agentIds"]]
        result: dict[str, Any] = {"sessions": sessions}
        if len(rows) > p.limit:
            result["nextCursor"] = str(int(rows[p.limit - 1]["suspendedAt"].timestamp() * 1000))
        return result

    def register(self, registry: Registry) -> None:
        """Add the methods (and the extended session.get, session.list and session.create)."""
        self._create_plain = registry.methods["session.create"].handler
        write, read = "sessions:write", "sessions:read"
        registry.add("session.create", CreateIdleParams, self._create, write)
        registry.add("session.get", GetAtParams, self._get, read)
        registry.add("session.list", ListStatusParams, self._list, read)
        registry.add("session.diff", DiffParams, self._diff, read)
        registry.add("session.snapshot", SessionParams, self._snapshot, write)
        registry.add("session.compact", CompactParams, self._compact, write)
        registry.add("session.fork", ForkParams, self._fork, write)
        registry.add("session.suspend", SessionParams, self._suspend, write)
        registry.add("session.resume", SessionParams, self._resume, write)
        registry.add("session.clear", SessionParams, self._clear, "admin")

    async def _create(self, call: Call, p: CreateIdleParams) -> Result:
        if (p.onIdle or self.settings.on_idle) != "suspend":
            return await self._create_plain(call, p)
        if p.ttl is not None and p.ttl > self.settings.session_ttl:
            raise InvalidParams("invalid params", [{"field": "ttl", "message": f"at most {self.settings.session_ttl} "
                                                    "(MEMENTO_SESSION_TTL)"}])
        return await self.manager.create(call.identity, entity_ids=p.entityIds, session_id=p.sessionId, ttl=p.ttl,
                                         labels=p.labels, on_idle="suspend")

    async def _get(self, call: Call, p: GetAtParams) -> Result:
        if p.atSeq is not None:
            return await self.history.get_at(call.identity.namespace, p.sessionId, p.atSeq)
        return await self.manager.get(call.identity.namespace, p.sessionId, condensed=p.condensed, since=p.since,
                                      limit=p.limit)

    async def _list(self, call: Call, p: ListStatusParams) -> Result:
        return await self.list_sessions(call.identity.namespace, p)

    async def _diff(self, call: Call, p: DiffParams) -> Result:
        return await self.history.diff(call.identity.namespace, p.sessionId, p.fromSeq, p.toSeq)

    async def _snapshot(self, call: Call, p: SessionParams) -> Result:
        return await self.history.snapshot(call.identity.namespace, p.sessionId)

    async def _compact(self, call: Call, p: CompactParams) -> Result:
        return await self.history.compact(call.identity.namespace, p.sessionId, p.beforeSeq)

    async def _fork(self, call: Call, p: ForkParams) -> Result:
        return await self.lifecycle.fork(call.identity, p.sessionId, p.atSeq, p.newSessionId)

    async def _suspend(self, call: Call, p: SessionParams) -> Result:
        return await self.lifecycle.suspend(call.identity.namespace, p.sessionId)

    async def _resume(self, call: Call, p: SessionParams) -> Result:
        return await self.lifecycle.resume(call.identity.namespace, p.sessionId)

    async def _clear(self, call: Call, p: SessionParams) -> Result:
        return await self.lifecycle.clear(call.identity.namespace, p.sessionId)


def stored_view(row: dict[str, Any]) -> dict[str, Any]:
    """A suspended or archived session as session.list shows it."""
    fields = row["fields"]
    return {"sessionId": row["sessionId"], "status": row["status"], "state": row["state"], "seq": row["seq"],
            "epoch": row["epoch"], "agentIds": row["agentIds"], "createdAt": iso(int(fields["createdAt"])),
            "updatedAt": iso(int(fields["updatedAt"])), "suspendedAt": row["suspendedAt"].isoformat(),
            "labels": pydantic_core.from_json(fields.get("labels") or "{}")}


def register(registry: Registry, manager: SessionManager, backends: Backends) -> LifecycleService:
    """Build the lifecycle service and register its methods; the caller runs its `run` loop."""
    service = LifecycleService(manager, backends)
    service.register(registry)
    return service
