"""SessionManager: every session read and write, each write one Redis Function call."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic_core
import redis.asyncio as aioredis
from prometheus_client import Counter

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.backends import UNAVAILABLE
from memento_sessions.errors import Forbidden, InvalidParams, NotFound
from memento_sessions.logs import get_logger
from memento_sessions.metrics import EMIT_SECONDS, EVENTS
from memento_sessions.rpc import encode_notification
from memento_sessions.sessions.condense import condense
from memento_sessions.sessions.models import KNOWN_TYPES, MAX_EVENT_BYTES, ChangeInfo, EventIn
from memento_sessions.sessions.pipe import Pipe
from memento_sessions.sessions.store import FunctionStore
from memento_sessions.settings import Settings

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Emitted:
    """What one emit did: its seq, whether it was a replay of an earlier id, and the event."""

    seq: int
    duplicate: bool
    event: EventIn


EmitListener = Callable[[str, str, Sequence[Emitted]], None]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC with a Z."""
    return f"{_iso_second(ms // 1000)}.{ms % 1000:03d}Z"


@functools.lru_cache(maxsize=4)
def _iso_second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def json_text(value: str) -> str:
    """A string as a JSON string literal."""
    return pydantic_core.to_json(value).decode()


_NOT_IN_REST = {"type", "actor"}


def event_body(event: EventIn, actor: str, session_json: str, now: str) -> str:
    """The stored event's JSON without its opening brace; the Function splices `{"seq":N,` in front.

    Its keys: type, actor, sessionId (`session_json`, already a JSON string), the event's other fields
    in model order, and the server's `timestamp` last when the client sent none.
    """
    rest = event.model_dump_json(by_alias=True, exclude_none=True, exclude=_NOT_IN_REST)[1:-1]
    stamp = "" if event.timestamp else f',"timestamp":"{now}"'
    text = (f'"type":{json_text(event.type)},"actor":{json_text(actor)},"sessionId":{session_json}'
            f'{"," if rest else ""}{rest}{stamp}}}')
    if len(text) + 25 > MAX_EVENT_BYTES:
        raise InvalidParams("event too large", [{"field": "event", "message": f"{len(text) + 1} bytes encoded; "
                                                 f"at most {MAX_EVENT_BYTES}"}])
    return text


def check_actor(event: EventIn, who: Identity, field: str) -> None:
    """The actor is always the token's agent; naming another is refused."""
    if event.actor is not None and event.actor != who.agent_id:
        raise Forbidden("actor differs from the token's agent",
                        [{"field": field, "message": f"must be {who.agent_id!r} (the token's agent) or absent"}])


def session_view(session_id: str, fields: dict[str, str], agents: Sequence[str], pttl: int) -> dict[str, Any]:
    """The session object of SPEC section 4 from its hash, members and remaining TTL."""
    view: dict[str, Any] = {
        "sessionId": session_id, "state": fields["state"], "agentIds": sorted(agents),
        "seq": int(fields.get("seq") or 0), "epoch": fields.get("epoch", ""),
        "createdAt": iso(int(fields["createdAt"])), "updatedAt": iso(int(fields["updatedAt"])),
        "expiresAt": iso(now_ms() + max(pttl, 0)),
        "lastCheckpoint": pydantic_core.from_json(fields["lastCheckpoint"]) if fields.get("lastCheckpoint") else None,
        "labels": pydantic_core.from_json(fields.get("labels") or "{}"),
    }
    if fields.get("parentSessionId"):
        view["parentSessionId"] = fields["parentSessionId"]
        view["forkedAtSeq"] = int(fields.get("forkedAtSeq") or 0)
    return view


@functools.lru_cache(maxsize=4096)
def route(namespace: str, session_id: str) -> tuple[keys.SessionKeys, str, str]:
    """A session's keys, channel and id as JSON: built once, reused by the session's next emits."""
    return keys.session_keys(namespace, session_id), keys.session_channel(namespace, session_id), json_text(session_id)


@functools.cache
def events_counter(event_type: str) -> Counter:
    """The `memento_events_total` child of a type (types outside KNOWN_TYPES count as `other`)."""
    return EVENTS.labels(event_type if event_type in KNOWN_TYPES else "other")


class SessionManager:
    """Create, join, leave, read, list and emit into sessions of any namespace."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, pipe: Pipe | None = None) -> None:
        self.redis = redis
        self.settings = settings
        self.store = FunctionStore(redis, pipe)
        self.listeners: list[EmitListener] = []

    async def start(self) -> None:
        """Load the Function library (every daemon does, REPLACE makes it idempotent).

        With Redis down the daemon still starts (and says so on /readyz): the first call that finds
        the library missing loads it then.
        """
        try:
            await self.store.load()
        except UNAVAILABLE as exc:
            log.warning("function library not loaded yet; Redis unavailable", error=repr(exc))

    async def create(self, who: Identity, *, entity_ids: Sequence[str] = (), session_id: str | None = None,
                     ttl: int | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """A new working session with `who` as its first agent; with entity ids, a `start` event is seq 1."""
        sid = session_id or f"sess-{uuid.uuid4()}"
        ttl = ttl or self.settings.session_ttl
        now, epoch, labels = now_ms(), uuid.uuid4().hex[:16], labels or {}
        announce = encode_notification("sessions.announce", {"type": "new", "sessionId": sid,
                                                             "agentId": who.agent_id, "labels": labels})
        await self.store.call("ms_create", keys.session_keys(who.namespace, sid), now, ttl, who.agent_id, epoch,
                              pydantic_core.to_json(labels).decode(), keys.announce_channel(who.namespace),
                              announce.decode(), "", "")
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.session_index(who.namespace), {sid: now})
            pipe.sadd(keys.namespaces(), who.namespace)
            await pipe.execute()
        seq = 0
        if entity_ids:
            start = EventIn(type="start", changeInfo=ChangeInfo(elementType="session", entityIds=list(entity_ids),
                                                                operation="init"))
            seq = (await self.emit(who, sid, start)).seq
        return {"sessionId": sid, "state": "working", "seq": seq, "agentIds": [who.agent_id],
                "expiresAt": iso(now + ttl * 1000), "epoch": epoch}

    async def join(self, who: Identity, session_id: str) -> dict[str, Any]:
        """Add `who` to the session's agents."""
        skeys = keys.session_keys(who.namespace, session_id)
        state, seq = await self.store.call("ms_join", skeys, now_ms(), who.agent_id)
        agents = await self.redis.smembers(skeys.agents)
        return {"sessionId": session_id, "agentIds": sorted(agents), "state": state, "seq": int(seq)}

    async def leave(self, who: Identity, session_id: str) -> None:
        """Remove `who` from the session's agents."""
        await self.store.call("ms_leave", keys.session_keys(who.namespace, session_id), now_ms(), who.agent_id)

    async def emit(self, who: Identity, session_id: str, event: EventIn) -> Emitted:
        """Store and publish one event; a replayed `id` returns the original seq, writing nothing."""
        check_actor(event, who, "event.actor")
        return (await self._emit(who, session_id, [event]))[0]

    async def emit_batch(self, who: Identity, session_id: str, events: Sequence[EventIn]) -> list[Emitted]:
        """Store and publish several events in one Function call, in order."""
        for i, event in enumerate(events):
            check_actor(event, who, f"events.{i}.actor")
        return await self._emit(who, session_id, events)

    async def _emit(self, who: Identity, session_id: str, events: Sequence[EventIn]) -> list[Emitted]:
        started = time.perf_counter()
        now = now_ms()
        stamp = iso(now)
        skeys, channel, session_json = route(who.namespace, session_id)
        args: list[str | int] = [now, who.agent_id, channel, session_json]
        for event in events:
            args += [event.id or "", event.new_state(), event_body(event, who.agent_id, session_json, stamp)]
        flat = await self.store.call("ms_emit", skeys, *args)
        done = [Emitted(int(flat[2 * i]), flat[2 * i + 1] == 1, event) for i, event in enumerate(events)]
        EMIT_SECONDS.observe(time.perf_counter() - started)
        for item in done:
            if not item.duplicate:
                events_counter(item.event.type).inc()
        for listener in self.listeners:
            listener(who.namespace, session_id, done)
        return done

    async def get(self, namespace: str, session_id: str, *, condensed: bool = False, since: int = 0,
                  limit: int | None = None) -> dict[str, Any]:
        """The session with its events after `since` (or, condensed, their summary)."""
        session, members = await self.read(namespace, session_id, since, None if condensed else limit)
        events = [pydantic_core.from_json(member) for member in members]
        if condensed:
            return {"session": session, **condense(events), "lastCheckpoint": session["lastCheckpoint"]}
        return {"session": session, "events": events}

    async def read(self, namespace: str, session_id: str, since: int = 0,
                   limit: int | None = None) -> tuple[dict[str, Any], list[str]]:
        """The session view and its raw stored events with seq > since, in one transaction."""
        skeys = keys.session_keys(namespace, session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(skeys.session)
            pipe.smembers(skeys.agents)
            pipe.pttl(skeys.session)
            pipe.zrangebyscore(skeys.events, f"({since}", "+inf", start=0 if limit else None, num=limit)
            fields, agents, pttl, members = await pipe.execute()
        if not fields:
            raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})
        return session_view(session_id, fields, list(agents), pttl), members

    async def list_sessions(self, namespace: str, *, state: str | None = None, agent_id: str | None = None,
                   limit: int = 50) -> list[dict[str, Any]]:
        """Sessions of the namespace, newest first, from the index (never KEYS or SCAN)."""
        found: list[dict[str, Any]] = []
        index, start, chunk = keys.session_index(namespace), 0, max(limit, 50)
        while len(found) < limit and start < 20 * chunk:
            ids = [str(sid) for sid in await self.redis.zrevrange(index, start, start + chunk - 1)]
            if not ids:
                break
            views = await self._views(namespace, ids)
            found += [v for v in views if v and (state is None or v["state"] == state)
                      and (agent_id is None or agent_id in v["agentIds"])]
            start += chunk
        return found[:limit]

    async def _views(self, namespace: str, ids: list[str]) -> list[dict[str, Any] | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in ids:
                skeys = keys.session_keys(namespace, sid)
                pipe.hgetall(skeys.session)
                pipe.smembers(skeys.agents)
                pipe.pttl(skeys.session)
            replies = await pipe.execute()
        views: list[dict[str, Any] | None] = []
        for i, sid in enumerate(ids):
            fields, agents, pttl = replies[3 * i: 3 * i + 3]
            views.append(session_view(sid, fields, list(agents), pttl) if fields else None)
        return views
