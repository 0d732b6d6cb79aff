"""What coordination does around other methods: each step wraps a method's handler, and api/ declares which
steps run around which method, in order, composed once at start.

- `activity`: every method notes its caller as active (presence, liveness) and known to the mailbox;
- `presence_enter` / `presence_exit`: session.join and .subscribe, .leave and .unsubscribe move presence;
- `visit`: a join or emit makes its agent present in the session however it came (MCP, the hook, ingest);
- `outcome`: an emitted break or fix tells the agents that lease what its session changed (outcomes.py);
- `fenced_emit` / `fenced_batch`: event.emit and .emitBatch check a task's completion against its claim and
  sync fencing marks before the write (tasks.py), and report and alert conflicts after it;
- `graph_write`: a graph write (kg.upsert) replaces the graph version lease grants check coverage against.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from memento_sessions.backends import UNAVAILABLE
from memento_sessions.coordination.alerts import touched
from memento_sessions.coordination.outcomes import outcome_state
from memento_sessions.coordination.service import Coordination
from memento_sessions.coordination.tasks import check_completions
from memento_sessions.errors import Conflict, Reason
from memento_sessions.logs import get_logger
from memento_sessions.metrics import STALE_LEASE_REFUSALS
from memento_sessions.rpc import Call, Handler, Result
from memento_sessions.sessions.models import EventIn

log = get_logger("memento_sessions.coordination.methods")  # the lines it logged from there


def activity(coord: Coordination, inner: Handler) -> Handler:
    """Every method: its caller noted active (presence, liveness) and known to the mailbox."""
    async def handler(call: Call, params: Any) -> Result:
        await coord.seen(call)
        await coord.mailbox.remember(call.identity)  # a dict lookup, but for an agent's first call an hour
        return await inner(call, params)
    return handler


def presence_enter(coord: Coordination, inner: Handler) -> Handler:
    """session.join and .subscribe: the connection enters the session's presence."""
    return presence(coord, inner, enter=True)


def presence_exit(coord: Coordination, inner: Handler) -> Handler:
    """session.leave and .unsubscribe: the connection, and the agent's visit, leave the session's presence."""
    return presence(coord, inner, enter=False)


def presence(coord: Coordination, inner: Handler, *, enter: bool) -> Handler:
    async def handler(call: Call, params: Any) -> Result:
        result = await inner(call, params)
        conn = await coord.seen(call)
        if conn is not None:
            await (coord.presence.enter if enter else coord.presence.exit)(conn, params.sessionId)
        if not enter:
            await coord.presence.unvisit(call.identity.namespace, params.sessionId, call.identity.agent_id)
        return result
    return handler


def visit(coord: Coordination, inner: Handler) -> Handler:
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


def outcome(coord: Coordination, inner: Handler) -> Handler:
    """event.emit and .emitBatch: an emitted break or fix tells the agents that lease what its session changed
    (outcomes.py)."""
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


def fenced(events: list[EventIn]) -> list[str]:
    """The entities of the events that carry a fencing token."""
    return sorted({entity for event in events if event.fencingToken is not None and event.changeInfo
                   for entity in event.changeInfo.entityIds})


async def write_fenced(coord: Coordination, call: Call, session_id: str, events: list[EventIn],
                       write: Callable[[], Awaitable[Result]]) -> Result:
    """Run an emit after checking a task's completion against its claim and syncing the session's fencing marks;
    a stale token is counted."""
    entities = fenced(events)
    try:
        await check_completions(coord.leases, call.identity.namespace, events)  # a task's claim fences its end
        if entities:
            await coord.leases.sync_fences(call.identity.namespace, session_id, entities)
        return await write()
    except Conflict as exc:
        if isinstance(exc.data, dict) and exc.data.get("reason") == Reason.STALE_LEASE:
            STALE_LEASE_REFUSALS.inc()
        raise


def fenced_emit(coord: Coordination, inner: Handler) -> Handler:
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


async def stored_conflicts(check: asyncio.Future[list[Result]]) -> list[Result]:
    """The conflicts read beside a stored emit; a Redis failure there must not turn the stored emit into an
    error (its retry would be a duplicate, alerted by nobody), so it is logged and the alert skipped."""
    try:
        return await check
    except UNAVAILABLE as exc:
        log.warning("conflict check failed after a stored emit; no alert", error=repr(exc))
        return []


def fenced_batch(coord: Coordination, inner: Handler) -> Handler:
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


def graph_write(coord: Coordination, inner: Handler) -> Handler:
    """A graph write (kg.upsert): a new graph version after it, even a failed one (it may have written part),
    so no daemon grants a lease from containment read before it (coverage.py)."""
    async def handler(call: Call, params: Any) -> Result:
        try:
            return await inner(call, params)
        finally:
            await coord.leases.coverage.changed(call.identity.namespace)
    return handler
