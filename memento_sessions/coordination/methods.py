"""JSON-RPC methods of coordination (presence.*, lease.*, mailbox.*, hook.answer) and its hooks on the session
methods.

The hooks wrap methods already in the registry rather than editing them: every method notes the caller
as active (presence, liveness); session.join/subscribe/leave/unsubscribe move presence; event.emit and
event.emitBatch sync fencing marks before the write and report and alert conflicts after it;
bridge.handoff adds the session's current leases and open conflicts; a graph write (kg:write methods)
replaces the graph version that lease grants check their coverage against.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import (
    AfterValidator,
    Field,
    JsonValue,
    StringConstraints,
    model_validator,
)

from memento_sessions.auth import MAX_ROLES, ROLE
from memento_sessions.backends import UNAVAILABLE
from memento_sessions.coordination.alerts import touched
from memento_sessions.coordination.answers import HookAnswers
from memento_sessions.coordination.hook_text import notice
from memento_sessions.coordination.outcomes import outcome_state
from memento_sessions.coordination.service import Coordination
from memento_sessions.coordination.tasks import check_completions
from memento_sessions.errors import Conflict
from memento_sessions.logs import get_logger
from memento_sessions.metrics import STALE_LEASE_REFUSALS
from memento_sessions.rpc import Call, Method, Registry, Result
from memento_sessions.sessions.methods import Params, SessionParams
from memento_sessions.sessions.models import MAX_DATA_BYTES, ClientId, EntityId, EventIn, Seq, ShortText, client_id
from memento_sessions.sessions.storable import value_problem

log = get_logger(__name__)
RoleName = Annotated[str, StringConstraints(pattern=ROLE.pattern)]
AGENT = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def check_recipient(value: str) -> str:
    """`role:<name>`, `session:<id>` or an agent id. What starts `role:` or `session:` is always read as one, so
    `role:`, `role:a:b` or a role name over 64 characters is an error, never an agent of that odd name."""
    kind, colon, name = value.partition(":")
    if colon and kind == "role":
        if not ROLE.fullmatch(name):
            raise ValueError("role:<name> needs a name of [A-Za-z0-9._-], 1..64 characters")
    elif colon and kind == "session":
        if not AGENT.fullmatch(name):
            raise ValueError("session:<id> needs an id of [A-Za-z0-9._:-], 1..128 characters")
    elif not AGENT.fullmatch(value):
        raise ValueError("an agent id is [A-Za-z0-9._:-], 1..128 characters")
    return value


Recipient = Annotated[str, AfterValidator(check_recipient)]


def check_body(value: JsonValue) -> JsonValue:
    """A message body is stored JSON like an event's data: finite numbers, clean text, at most 16 KiB."""
    problem = value_problem(value, "body")
    size = len(pydantic_core.to_json(value)) if problem is None else 0
    if problem or size > MAX_DATA_BYTES:
        raise ValueError(problem or f"body is larger than {MAX_DATA_BYTES} bytes encoded")
    return value


class RolesParams(Params):
    roles: list[RoleName] = Field(max_length=MAX_ROLES)


class AcquireParams(Params):
    entityIds: list[EntityId] = Field(min_length=1, max_length=64)
    ttl: int = Field(ge=5, le=3600)
    mode: Literal["exclusive", "shared", "intent"] = "exclusive"
    sessionId: ClientId | None = None
    reason: ShortText | None = None


class RenewParams(Params):
    leaseId: ClientId
    ttl: int = Field(ge=5, le=3600)


class ReleaseParams(Params):
    leaseId: ClientId


class ListLeasesParams(Params):
    entityId: EntityId | None = None
    agentId: ClientId | None = None
    cursor: ClientId | None = None  # a previous page's nextCursor
    limit: int = Field(default=100, ge=1, le=1000)

    @model_validator(mode="after")
    def _one_filter(self) -> ListLeasesParams:
        if self.entityId is not None and self.agentId is not None:
            raise ValueError("give entityId or agentId, not both")
        return self


class SendParams(Params):
    to: Recipient
    subject: ShortText | None = None
    body: Annotated[JsonValue, AfterValidator(check_body)]
    ttl: int | None = Field(default=None, ge=60, le=30 * 86400)
    id: Annotated[ClientId, AfterValidator(client_id)] | None = None  # never one of the daemon's own alert ids


class ReadParams(Params):
    since: Seq = 0
    limit: int = Field(default=100, ge=1, le=1000)
    unreadOnly: bool = False


class AckParams(Params):
    messageIds: list[ClientId] = Field(min_length=1, max_length=1000)


class StatusParams(Params):
    messageId: ClientId


class SurfaceParams(Params):
    limit: int = Field(default=20, ge=1, le=100)


class HookParams(Params):
    input: JsonValue  # Claude Code's hook input as it came: anything malformed is answered `{}` and counted
    root: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None  # the project root
    leases: Literal["off", "warn", "enforce"] | None = None  # the lease policy (default MEMENTO_HOOK_LEASES)
    claimTtl: int | None = Field(default=None, ge=0, le=3600)  # an edit's claim (default MEMENTO_HOOK_CLAIM_TTL)


Handler = Callable[[Call, Any], Awaitable[Result]]


def register(registry: Registry, coord: Coordination) -> None:
    """Add the coordination methods, then hook the session, emit and handoff methods already registered."""
    for name, (params, handler, scope) in methods(coord).items():
        registry.add(name, params, handler, scope)
    hook(registry, coord)
    registry.on_connect.append(coord.connect)
    registry.on_connect.append(lambda call: coord.mailbox.remember(call.identity))  # a send may reach it now


def methods(coord: Coordination) -> dict[str, tuple[type[Params], Handler, str]]:
    """The coordination methods: name -> (params, handler, scope)."""
    async def presence_get(call: Call, p: SessionParams) -> Result:
        return {"agents": await coord.presence.agents(call.identity.namespace, p.sessionId)}

    async def presence_set(call: Call, p: RolesParams) -> Result:
        return await coord.presence.set_roles(call.identity, p.roles)

    async def acquire(call: Call, p: AcquireParams) -> Result:
        return await coord.acquire(call.identity, p.entityIds, p.ttl, p.mode, p.sessionId, p.reason)

    async def renew(call: Call, p: RenewParams) -> Result:
        return await coord.leases.renew(call.identity, p.leaseId, p.ttl)

    async def release(call: Call, p: ReleaseParams) -> Result:
        return await coord.leases.release(call.identity, p.leaseId)

    async def list_(call: Call, p: ListLeasesParams) -> Result:
        return await coord.leases.listed(call.identity.namespace, p.entityId, p.agentId, p.cursor, p.limit)

    async def send(call: Call, p: SendParams) -> Result:
        return await coord.mailbox.send(call.identity, p.to, p.body, p.subject, p.ttl, p.id)

    async def read_(call: Call, p: ReadParams) -> Result:
        return await coord.mailbox.read(call.identity, p.since, p.limit, p.unreadOnly)

    async def ack(call: Call, p: AckParams) -> Result:
        return await coord.mailbox.ack(call.identity, p.messageIds)

    write, read = "sessions:write", "sessions:read"
    return {
        "presence.get": (SessionParams, presence_get, read), "presence.set": (RolesParams, presence_set, write),
        "lease.acquire": (AcquireParams, acquire, write), "lease.renew": (RenewParams, renew, write),
        "lease.release": (ReleaseParams, release, write), "lease.list": (ListLeasesParams, list_, read),
        "mailbox.send": (SendParams, send, write), "mailbox.read": (ReadParams, read_, read),
        "mailbox.ack": (AckParams, ack, write), **loop_methods(coord)}


def loop_methods(coord: Coordination) -> dict[str, tuple[type[Params], Handler, str]]:
    """What brings the swarm back into an agent's context: receipts, notices, the hooks' answers."""
    async def status(call: Call, p: StatusParams) -> Result:
        return await coord.mailbox.receipts.status(call.identity, p.messageId)

    async def surface(call: Call, p: SurfaceParams) -> Result:
        return {"notices": [notice(message) for message in await coord.mailbox.surface(call.identity, p.limit)]}

    answers = HookAnswers(coord)

    async def hook_answer(call: Call, p: HookParams) -> Result:
        return {"output": await answers.answer(call.identity, p.input, p.root, p.leases, p.claimTtl)}

    return {"mailbox.status": (StatusParams, status, "sessions:read"),
            "mailbox.surface": (SurfaceParams, surface, "sessions:write"),
            "hook.answer": (HookParams, hook_answer, "sessions:write")}


def wrap(registry: Registry, name: str, make: Callable[[Handler], Handler]) -> None:
    """Replace a registered method's handler by `make(handler)` (nothing when it is not registered)."""
    method = registry.methods.get(name)
    if method is not None:
        registry.methods[name] = Method(name, method.params, make(method.handler), method.scope)


def hook(registry: Registry, coord: Coordination) -> None:
    """Wrap the methods coordination must see: every call (activity), presence moves, emits, handoff."""
    for name in ("session.join", "session.subscribe"):
        wrap(registry, name, lambda inner: presence_hook(coord, inner, enter=True))
    for name in ("session.leave", "session.unsubscribe"):
        wrap(registry, name, lambda inner: presence_hook(coord, inner, enter=False))
    for name in ("session.join", "event.emit", "event.emitBatch"):
        wrap(registry, name, lambda inner: visit_hook(coord, inner))
    wrap(registry, "event.emit", lambda inner: emit_hook(coord, inner))
    wrap(registry, "event.emitBatch", lambda inner: batch_hook(coord, inner))
    for name in ("event.emit", "event.emitBatch"):
        wrap(registry, name, lambda inner: outcome_hook(coord, inner))
    wrap(registry, "bridge.handoff", lambda inner: handoff_hook(coord, inner))
    for name in [name for name, method in registry.methods.items() if method.scope == "kg:write"]:
        wrap(registry, name, lambda inner: graph_write_hook(coord, inner))
    for name in list(registry.methods):
        wrap(registry, name, lambda inner: activity_hook(coord, inner))


def activity_hook(coord: Coordination, inner: Handler) -> Handler:
    async def handler(call: Call, params: Any) -> Result:
        await coord.seen(call)
        await coord.mailbox.remember(call.identity)  # a dict lookup, but for an agent's first call an hour
        return await inner(call, params)
    return handler


def presence_hook(coord: Coordination, inner: Handler, *, enter: bool) -> Handler:
    async def handler(call: Call, params: Any) -> Result:
        result = await inner(call, params)
        conn = await coord.seen(call)
        if conn is not None:
            await (coord.presence.enter if enter else coord.presence.exit)(conn, params.sessionId)
        if not enter:
            await coord.presence.unvisit(call.identity.namespace, params.sessionId, call.identity.agent_id)
        return result
    return handler


def visit_hook(coord: Coordination, inner: Handler) -> Handler:
    """A join or emit makes its agent present in the session however it came (MCP, the hook, ingest), unless a
    connection of it already stands there (presence.py)."""
    async def handler(call: Call, params: Any) -> Result:
        result = await inner(call, params)
        conn = coord.presence.conns.get(call.peer.conn_id) if call.peer is not None else None
        if conn is None or params.sessionId not in conn.sessions:
            try:
                await coord.presence.visit(call.identity.namespace, params.sessionId, call.identity.agent_id)
            except UNAVAILABLE as exc:  # the write is done: its reply must not fail (the beat writes the field)
                log.warning("presence of a visit not written yet", agent_id=call.identity.agent_id, error=repr(exc))
        return result
    return handler


def fenced(events: list[EventIn]) -> list[str]:
    """The entities of the events that carry a fencing token."""
    return sorted({entity for event in events if event.fencingToken is not None and event.changeInfo
                   for entity in event.changeInfo.entityIds})


async def write_fenced(coord: Coordination, call: Call, session_id: str, events: list[EventIn],
                       write: Callable[[], Awaitable[Result]]) -> Result:
    """Run an emit after syncing the session's fencing marks; a stale token is counted."""
    entities = fenced(events)
    try:
        await check_completions(coord.leases, call.identity.namespace, events)  # a task's claim fences its end
        if entities:
            await coord.leases.sync_fences(call.identity.namespace, session_id, entities)
        return await write()
    except Conflict as exc:
        if isinstance(exc.data, dict) and exc.data.get("reason") == "stale_lease":
            STALE_LEASE_REFUSALS.inc()
        raise


def emit_hook(coord: Coordination, inner: Handler) -> Handler:
    """The emit with its fencing marks synced, then its conflicts reported and alerted."""
    async def handler(call: Call, params: Any) -> Result:
        event = params.event
        write = write_fenced(coord, call, params.sessionId, [event], lambda: inner(call, params))
        if not touched(event):  # nothing a lease could conflict with: no check, no task
            return await write
        # The holds are read while the emit is in flight (the two round trips overlap on the pipelined
        # connection), so an emit that touches no lease costs about nothing more; dropped if the emit fails.
        check = asyncio.create_task(coord.alerts.check(call.identity, event))
        try:
            result = await write
        except BaseException:
            check.cancel()
            if check.done() and not check.cancelled():
                check.exception()  # retrieved: the emit's own error is what the caller gets
            raise
        conflicts = await stored_conflicts(check)
        if conflicts and not result.get("duplicate"):
            await coord.alerts.alert(call.identity, params.sessionId, result["seq"], event, conflicts)
            result["conflicts"] = conflicts
        return result
    return handler


def outcome_hook(coord: Coordination, inner: Handler) -> Handler:
    """An emitted break or fix tells the agents that lease what its session changed (outcomes.py)."""
    async def handler(call: Call, params: Any) -> Result:
        result = await inner(call, params)
        events = [params.event] if hasattr(params, "event") else params.events
        seqs = [result["seq"]] if "seq" in result else result["seqs"]
        duplicates = set(result.get("duplicates", ())) | ({result["seq"]} if result.get("duplicate") else set())
        stored = [(seq, event) for seq, event in zip(seqs, events, strict=True)
                  if seq not in duplicates and outcome_state(event)]
        if stored:
            try:
                await coord.outcomes.after(call.identity, params.sessionId, stored)
            except UNAVAILABLE as exc:  # the emit is stored: its reply must not fail
                log.warning("outcome not told to the holders", error=repr(exc))
        return result
    return handler


async def stored_conflicts(check: asyncio.Future[list[Result]]) -> list[Result]:
    """The conflicts read beside a stored emit; a Redis failure there must not turn the stored emit into an
    error (its retry would be a duplicate, alerted by nobody), so it is logged and the alert skipped."""
    try:
        return await check
    except UNAVAILABLE as exc:
        log.warning("conflict check failed after a stored emit; no alert", error=repr(exc))
        return []


def batch_hook(coord: Coordination, inner: Handler) -> Handler:
    """The batch paced (its namespace's batches name at most MEMENTO_BATCH_IDS_PACE entity ids a second per
    daemon), written with its fencing marks synced, then its conflicts reported and alerted."""
    async def handler(call: Call, params: Any) -> Result:
        await coord.alerts.batches.take(call.identity.namespace, sum(len(touched(event)) for event in params.events))
        result = await write_fenced(coord, call, params.sessionId, params.events,
                                    lambda: inner(call, params))
        duplicates = set(result.get("duplicates", ()))
        stored = [(seq, event) for seq, event in zip(result["seqs"], params.events, strict=True)
                  if seq not in duplicates]
        found = await coord.alerts.after_batch(call.identity, params.sessionId, stored)
        if found:
            result["conflicts"] = found
        return result
    return handler


def graph_write_hook(coord: Coordination, inner: Handler) -> Handler:
    """A graph write (kg.upsert): a new graph version after it, even a failed one (it may have written part),
    so no daemon grants a lease from containment read before it (coverage.py)."""
    async def handler(call: Call, params: Any) -> Result:
        try:
            return await inner(call, params)
        finally:
            await coord.leases.coverage.changed(call.identity.namespace)
    return handler


def handoff_hook(coord: Coordination, inner: Handler) -> Handler:
    async def handler(call: Call, params: Any) -> Result:
        result = await inner(call, params)
        result.update(await coord.handoff_leases(call.identity.namespace, result))
        return result
    return handler
