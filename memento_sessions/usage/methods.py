"""`usage.get`, and the step after every emit that folds what the stored events say about usage.

The step sees the emit's params and its result: only events stored now (not duplicates) are folded, so
re-ingesting a transcript counts nothing twice; a batch with no usage event, run start or end, or
finished tool call costs no Redis call at all.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints
from redis.exceptions import ResponseError

from memento_sessions.backends import UNAVAILABLE
from memento_sessions.errors import InvalidParams
from memento_sessions.logs import get_logger
from memento_sessions.rpc import Call, Method, Registry, Result
from memento_sessions.usage import query
from memento_sessions.usage.fold import ops_of, relevant
from memento_sessions.usage.store import UsageStore

log = get_logger(__name__)
FOLD_FAILURES: tuple[type[BaseException], ...] = (*UNAVAILABLE, ResponseError)
Handler = Callable[[Call, Any], Awaitable[Result]]
Id = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
Cursor = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,16}:[A-Za-z0-9._: -]{1,300}$")]
PAGE = 100


def _text(value: Any) -> Any:
    if not isinstance(value, str):  # strict: ISO-8601 text, never a number read as epoch seconds
        raise ValueError("must be an ISO-8601 string")
    return value


class UsageParams(BaseModel):
    """Strict JSON types, as every method's params: `"60"` is not 60, `true` not 1 (-32602 naming the field)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sessionId: Id | None = None
    agentId: Id | None = None
    # runs started at or after this time (strict mode takes no text for a datetime: this field parses its own)
    since: Annotated[AwareDatetime, Field(strict=False), BeforeValidator(_text)] | None = None
    cursor: Cursor | None = None  # a previous page's nextCursor
    limit: int = Field(default=PAGE, ge=1, le=500)


async def get(store: UsageStore, call: Call, p: UsageParams) -> Result:
    """A session's or an agent's totals and runs, or (naming neither) the namespace's totals."""
    ns, redis = call.identity.namespace, store.redis
    since = int(p.since.timestamp() * 1000) if p.since else 0
    if p.sessionId is not None and p.agentId is not None:
        raise InvalidParams("invalid params", [{"field": "agentId", "message": "give sessionId or agentId, not both"}])
    if p.sessionId is not None:
        return await query.session_usage(redis, ns, p.sessionId, since, p.cursor, p.limit)
    if p.agentId is not None:
        return await query.agent_usage(redis, ns, p.agentId, since, p.cursor, p.limit)
    return {"namespace": ns, **await query.namespace_totals(redis, ns), "runs": []}


def folded(store: UsageStore, inner: Handler, *, batch: bool) -> Handler:
    """An emit handler that folds the stored events' usage after the write."""
    async def handler(call: Call, params: Any) -> Result:
        result = await inner(call, params)
        events = params.events if batch else [params.event]
        if not any(relevant(event) for event in events):
            return result
        if batch:
            seqs, duplicates = result["seqs"], set(result.get("duplicates", ()))
        else:
            seqs, duplicates = [result["seq"]], {result["seq"]} if result.get("duplicate") else set()
        stored = [(seq, event) for seq, event in zip(seqs, events, strict=True) if seq not in duplicates]
        ops = ops_of(stored, int(time.time() * 1000))
        try:
            await store.fold(call.identity.namespace, params.sessionId, call.identity.agent_id, "events", ops)
        except FOLD_FAILURES as exc:
            # The events are stored: an error now would make the client send them again, as duplicates
            # that fold nothing. So the stored emit stands, and the lost usage is logged.
            log.warning("usage not folded after a stored emit", session_id=params.sessionId, error=repr(exc))
        return result
    return handler


def register(registry: Registry, store: UsageStore) -> None:
    """Add usage.get, and the usage step after event.emit and event.emitBatch (registered before this)."""
    async def usage_get(call: Call, p: UsageParams) -> Result:
        return await get(store, call, p)

    registry.add("usage.get", UsageParams, usage_get, "sessions:read")
    for name, batch in (("event.emit", False), ("event.emitBatch", True)):
        method = registry.methods[name]
        registry.methods[name] = Method(name, method.params, folded(store, method.handler, batch=batch), method.scope)
