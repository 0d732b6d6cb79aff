"""SessionManager: every session read and write, each write one Redis Function call."""

from __future__ import annotations

import collections
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic_core
import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.asyncio.client import Pipeline

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.backends import UNAVAILABLE
from memento_sessions.errors import Conflict, Forbidden, InvalidParams, NotFound, Reason
from memento_sessions.limits import FOREGROUND
from memento_sessions.logs import get_logger
from memento_sessions.metrics import EMIT_SECONDS, EVENTS, REPLY_PAGES, SESSION_LIMIT_REFUSALS
from memento_sessions.redisio.pipe import Acks, Pipe
from memento_sessions.rpc import encode_notification
from memento_sessions.sessions.condense import Condenser
from memento_sessions.sessions.conversation import ConversationFold
from memento_sessions.sessions.functions import FunctionStore
from memento_sessions.sessions.models import KNOWN_TYPES, MAX_EVENT_BYTES, ChangeInfo, EncodedData, EventIn
from memento_sessions.sessions.paging import CHUNK, PAGE, Page, page_bytes, seq_of
from memento_sessions.sessions.snapshots import snapshot_at
from memento_sessions.settings import Settings
from memento_sessions.usage.query import session_totals

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Emitted:
    """What one emit did: its seq, whether it was a replay of an earlier id, and the event."""

    seq: int
    duplicate: bool
    event: EventIn


EmitListener = Callable[[str, str, Sequence[Emitted]], None]
FullHandler = Callable[["SessionManager", str, str], Awaitable[bool]]  # (manager, namespace, session id) -> room made
UNFENCED = "unfenced"  # ms_emit's last argument when no event of the call carries a fencingToken
WHOLE_FROM = 64 * 1024  # bytes of bodies from which an emit's events go to ms_emit as whole members (emit_args)
BODY_PART = 64  # events of a batch encoded between two turns of the event loop (about 0.3 ms of 256 ids each)
IDLE_MARGIN = 120  # seconds an onIdle=suspend session's keys outlive its TTL: the time to suspend it in


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC with a Z."""
    return f"{_iso_second(ms // 1000)}.{ms % 1000:03d}Z"


@functools.lru_cache(maxsize=4)
def _iso_second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def replica_acks(settings: Settings) -> Acks | None:
    """What an emit waits for before its reply (MEMENTO_REPLICA_ACKS replicas), None when nothing."""
    return Acks(settings.replica_acks, settings.replica_ack_timeout_ms) if settings.replica_acks else None


def json_text(value: str) -> str:
    """A string as a JSON string literal."""
    return pydantic_core.to_json(value).decode()


_NOT_IN_REST = {"type", "actor", "data", "fencingToken"}
_dump_json = EventIn.__pydantic_serializer__.to_json  # model_dump_json's own serializer, without its wrapper


@functools.lru_cache(maxsize=256)
def _quoted(text: str) -> str:
    """An agent id as a JSON string, made once per agent rather than once per event."""
    return json_text(text)


def emit_args(events: Sequence[EventIn], bodies: Sequence[str], seq: int | None = None) -> list[str | int]:
    """ms_emit's arguments after its first five: (id, new_state, body) per event, then its options. UNFENCED when
    no event carries a fencingToken, so the Function need not search the bodies for one. With `seq` (the
    session's seq, read just before a call of WHOLE_FROM bytes of bodies or more), each body is sent as the
    whole member it becomes if nothing comes first, `{"seq":N,` in front, and `from:<seq>` says so: the
    Function then stores them as they are, rather than copy 700 KB once more in Redis's one thread."""
    if seq is not None:
        bodies = [f'{{"seq":{seq + i},{body}' for i, body in enumerate(bodies, 1)]
    args: list[str | int] = []
    for event, body in zip(events, bodies, strict=True):
        args += [event.id or "", event.new_state(), body]
    if all(event.fencingToken is None for event in events):
        args.append(UNFENCED)
    if seq is not None:
        args.append(f"from:{seq}")
    return args


def sends_whole(bodies: Sequence[str]) -> bool:
    """Whether a call of these bodies goes to ms_emit as whole members (`emit_args` with the session's seq)."""
    return sum(map(len, bodies)) >= WHOLE_FROM


def event_body(event: EventIn, actor: str, session_json: str, now: str) -> str:
    """The stored event's JSON without its opening brace; `{"seq":N,` goes in front (the Function splices it,
    or `emit_args` for a call sent whole).

    Its keys: type, actor, sessionId (`session_json`, already a JSON string), the event's other fields
    in model order, and the server's `timestamp` last when the client sent none. The type is quoted as it
    is: its pattern (EventType) allows nothing JSON escapes. `data`, the bulk of most events, is the
    encoding its validation made (EncodedData), not encoded a second time.
    """
    parts = [f'"type":"{event.type}","actor":{_quoted(actor)},"sessionId":{session_json}']
    rest = _dump_json(event, by_alias=True, exclude_none=True, exclude=_NOT_IN_REST)
    if len(rest) > 2:
        parts.append(rest[1:-1].decode())
    if event.data is not None:
        data = event.data.encoded if isinstance(event.data, EncodedData) else pydantic_core.to_json(event.data)
        parts.append('"data":' + data.decode())
    if event.fencingToken is not None:
        parts.append(f'"fencingToken":{event.fencingToken}')
    if not event.timestamp:
        parts.append(f'"timestamp":"{now}"')
    text = ",".join(parts) + "}"
    if len(text) + 25 > MAX_EVENT_BYTES:
        raise InvalidParams("event too large", [{"field": "event", "message": f"{len(text) + 1} bytes encoded; "
                                                 f"at most {MAX_EVENT_BYTES}"}])
    return text


def start_body(start: EventIn, actor: str, session_json: str, now: str) -> str:
    """A create's start event body; too large is the fault of its entityIds, so the error names them."""
    try:
        return event_body(start, actor, session_json, now)
    except InvalidParams as exc:
        message = exc.data[0]["message"]
        raise InvalidParams("entityIds too large", [{"field": "entityIds", "message": message}]) from None


def check_actor(event: EventIn, who: Identity, field: str) -> None:
    """The actor is always the token's agent; naming another is refused."""
    if event.actor is not None and event.actor != who.agent_id:
        raise Forbidden("actor differs from the token's agent",
                        [{"field": field, "message": f"must be {who.agent_id!r} (the token's agent) or absent"}])


def session_view(session_id: str, fields: dict[str, str], agents: Sequence[str], pttl: int) -> dict[str, Any]:
    """The session object of the API (the README's data model) from its hash, members and remaining TTL."""
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
    view["status"] = "completed" if fields["state"] == "completed" else "active"
    if fields.get("compactedSeq"):
        view["compactedSeq"] = int(fields["compactedSeq"])
    if fields.get("onIdle"):
        view["onIdle"] = fields["onIdle"]
    return view


VIEW_READS = 3  # replies ask_view queues: the hash, the agents, the remaining TTL
EventRange = Callable[[Pipeline, str], object]  # queues one read of a session's events ZSET (its key given)


def ask_view(pipe: Pipeline, skeys: keys.SessionKeys) -> None:
    """Queue the reads a session view is made of (view_of turns their VIEW_READS replies into it)."""
    pipe.hgetall(skeys.session)
    pipe.smembers(skeys.agents)
    pipe.pttl(skeys.session)


def view_of(session_id: str, replies: Sequence[Any]) -> dict[str, Any] | None:
    """The view from ask_view's replies; None when the session has no hash (it expired or never was)."""
    fields, agents, pttl = replies
    return session_view(session_id, fields, list(agents), pttl) if fields else None


def events_after(since: int, limit: int | None) -> EventRange:
    """The stored events with seq > since, at most `limit` (all when None)."""
    return lambda pipe, key: pipe.zrangebyscore(key, f"({since}", "+inf", start=0 if limit else None, num=limit)


def last_events(count: int) -> EventRange:
    """The last `count` stored events."""
    return lambda pipe, key: pipe.zrange(key, -count, -1)


@functools.lru_cache(maxsize=4096)
def route(namespace: str, session_id: str) -> tuple[keys.SessionKeys, str, str]:
    """A session's keys, channel and id as JSON: built once, reused by the session's next emits."""
    return keys.session_keys(namespace, session_id), keys.session_channel(namespace, session_id), json_text(session_id)


_COUNTERS = {kind: EVENTS.labels(kind) for kind in (*sorted(KNOWN_TYPES), "other")}


def events_counter(event_type: str) -> Counter:
    """The `memento_events_total` child of a type; client-chosen types outside KNOWN_TYPES count as `other`,
    so neither the label set nor this lookup grows with what clients send."""
    return _COUNTERS.get(event_type) or _COUNTERS["other"]


SWEEP_OLDEST = 100  # index entries a create that finds its namespace full checks for expiry
LIST_CHUNK = 100  # index entries read per round trip by session.list
LIST_SCAN = 20 * LIST_CHUNK  # index entries one session.list call reads at most before it returns a cursor


def parse_cursor(cursor: str | None) -> tuple[str, tuple[int, str] | None]:
    """A session.list cursor `<createdMs>:<sessionId>` as the ZREVRANGEBYSCORE max and the last id listed."""
    if not cursor:
        return "+inf", None
    score, _, sid = cursor.partition(":")
    return score, (int(score), sid)


def matches(view: dict[str, Any], state: str | None, agent_id: str | None) -> bool:
    """Whether a session view passes session.list's filters."""
    return (state is None or view["state"] == state) and (agent_id is None or agent_id in view["agentIds"])


def before_cursor(sid: str, score: int, after: tuple[int, str] | None) -> bool:
    """True for index entries a previous page already covered: same creation ms, at or before its last id
    in ZREVRANGE order (which sorts equal scores by id, descending)."""
    return after is not None and score == after[0] and sid >= after[1]


class SessionManager:
    """Create, join, leave, read, list and emit into sessions of any namespace."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, pipe: Pipe | None = None, *,
                 on_emitted: Sequence[EmitListener] = (), on_full: FullHandler | None = None) -> None:
        """`on_emitted`: told of every stored emit, in order (the checkpointer's triggers); `on_full`: asked to
        make room when a session is full (auto-compaction, history/views.py), before the emit is refused."""
        self.redis = redis
        self.settings = settings
        self.store = FunctionStore(redis, pipe)
        self.on_emitted = tuple(on_emitted)
        self.on_full = on_full

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
                     ttl: int | None = None, labels: dict[str, str] | None = None,
                     on_idle: str = "expire") -> dict[str, Any]:
        """A new working session with `who` as its first agent; with entity ids, a `start` event is seq 1.

        Everything is checked before anything is written, and the session with its start event is one
        Function call, so a create that fails leaves nothing behind (no half-made session). With
        `on_idle="suspend"` its keys live IDLE_MARGIN seconds longer than `ttl`: the time the lifecycle
        has to move it to Postgres before Redis would expire it.
        """
        sid = session_id or f"sess-{uuid.uuid4()}"
        ttl = ttl or self.settings.session_ttl
        stored_ttl = ttl + IDLE_MARGIN if on_idle == "suspend" else ttl
        now, epoch, labels = now_ms(), uuid.uuid4().hex[:16], labels or {}
        start = EventIn(type="start", changeInfo=ChangeInfo(elementType="session", entityIds=list(entity_ids),
                                                            operation="init")) if entity_ids else None
        skeys, channel, session_json = route(who.namespace, sid)
        body = start_body(start, who.agent_id, session_json, iso(now)) if start else ""
        announce = encode_notification("sessions.announce", {"type": "new", "sessionId": sid,
                                                             "agentId": who.agent_id, "labels": labels})
        indexed = await self._reserve(who.namespace, sid, now)
        try:
            await self.store.call("ms_create", skeys, now, stored_ttl, who.agent_id, epoch,
                                  pydantic_core.to_json(labels).decode(), keys.announce_channel(who.namespace),
                                  announce.decode(), "", "", body, channel, session_json,
                                  on_idle if on_idle != "expire" else "")
        except BaseException:
            if indexed:  # the reservation was this call's own: undo it, the session does not exist
                await self.redis.zrem(keys.session_index(who.namespace), sid)
            raise
        await self._indexed(who.namespace, sid, now, indexed)
        if start is not None:
            self._notify(who.namespace, sid, [Emitted(1, False, start)])
        return {"sessionId": sid, "state": "working", "seq": 1 if start else 0, "agentIds": [who.agent_id],
                "expiresAt": iso(now + ttl * 1000), "epoch": epoch}

    async def reserve(self, namespace: str, session_id: str, now: int) -> bool:
        """Take a place for a new session in the namespace's index (False: it was indexed already)."""
        return await self._reserve(namespace, session_id, now)

    async def index(self, namespace: str, session_id: str, created_ms: int) -> None:
        """List a session again (a resumed one) under its creation time."""
        await self._indexed(namespace, session_id, created_ms, False)

    async def _reserve(self, namespace: str, session_id: str, now: int) -> bool:
        """Take a place in the namespace's index (False: the id was indexed already); namespace_full past
        MEMENTO_NAMESPACE_MAX_SESSIONS, after dropping the entries of sessions Redis has expired."""
        index, cap = keys.session_index(namespace), self.settings.namespace_max_sessions
        try:
            return await self.store.add_to_index(index, session_id, now, cap)
        except Conflict:
            # Expired sessions must not hold places: the janitor drops them every few seconds, and a create
            # that finds the namespace full drops those among the oldest first and tries once more (bounded
            # work, so a client hammering a full namespace cannot make each refusal scan the whole index).
            await self._drop_expired(index, namespace)
        try:
            return await self.store.add_to_index(index, session_id, now, cap)
        except Conflict:
            SESSION_LIMIT_REFUSALS.labels("namespace_full").inc()
            raise

    async def _drop_expired(self, index: str, namespace: str) -> None:
        ids = [str(sid) for sid in await self.redis.zrange(index, 0, SWEEP_OLDEST - 1)]
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.exists(keys.session_keys(namespace, sid).session)
            alive = await pipe.execute()
        if gone := [sid for sid, exists in zip(ids, alive, strict=True) if not exists]:
            await self.redis.zrem(index, *gone)

    async def _indexed(self, namespace: str, session_id: str, now: int, added: bool) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            if not added:  # an id re-used after its session expired: list it as the newest again
                pipe.zadd(keys.session_index(namespace), {session_id: now})
            pipe.sadd(keys.namespaces(), namespace)
            await pipe.execute()

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
        bodies: list[str] = []
        for i, event in enumerate(events):
            if i and not i % BODY_PART:
                await FOREGROUND.turn()  # a turn for other clients within a large batch
            bodies.append(event_body(event, who.agent_id, session_json, stamp))
        seq = None
        if sends_whole(bodies) and (head := await self.redis.hget(skeys.session, "seq")) is not None:
            seq = int(head)
        args: list[str | int] = [now, who.agent_id, channel, session_json, self.settings.session_max_events,
                                 *emit_args(events, bodies, seq)]
        acks = replica_acks(self.settings)
        try:
            flat = await self.store.call("ms_emit", skeys, *args, acks=acks)
        except Conflict as exc:
            if not (isinstance(exc.data, dict) and exc.data.get("reason") == Reason.SESSION_FULL):
                raise
            # With MEMENTO_AUTO_COMPACT on, a full session is compacted and the emit tried once more.
            if self.on_full is None or not await self.on_full(self, who.namespace, session_id):
                SESSION_LIMIT_REFUSALS.labels("session_full").inc()
                raise
            flat = await self.store.call("ms_emit", skeys, *args, acks=acks)
        done = [Emitted(int(flat[2 * i]), flat[2 * i + 1] == 1, event) for i, event in enumerate(events)]
        EMIT_SECONDS.observe(time.perf_counter() - started)
        self._notify(who.namespace, session_id, done)
        return done

    def _notify(self, namespace: str, session_id: str, done: list[Emitted]) -> None:
        # One increment per type, not per event: a batch holds few types.
        for kind, count in collections.Counter(item.event.type for item in done if not item.duplicate).items():
            events_counter(kind).inc(count)
        for listener in self.on_emitted:
            listener(namespace, session_id, done)

    async def get(self, namespace: str, session_id: str, *, condensed: bool = False, since: int = 0,
                  limit: int | None = None) -> dict[str, Any]:
        """The session with a page of its events after `since` (at most `limit`, 1,000 by default, and a
        quarter of the send buffer in bytes) and `nextSince` when more exist; or, condensed, their summary."""
        if condensed:
            return await self._condensed(namespace, session_id)
        session, page = await self._page(namespace, session_id, since, limit or PAGE)
        events = [pydantic_core.from_json(member) for member in page.items]
        result: dict[str, Any] = {"session": session, "events": events}
        if since < session.get("compactedSeq", 0):
            # The events up to compactedSeq are gone: the snapshot there stands for them, never a silent hole.
            snap = await snapshot_at(self.store, keys.session_keys(namespace, session_id), session["compactedSeq"])
            result["snapshot"] = snap.wire() if snap else None
        if page.more:
            result["nextSince"] = events[-1]["seq"]
            REPLY_PAGES.labels("session.get").inc()
        return result

    async def _page(self, namespace: str, session_id: str, since: int, limit: int) -> tuple[dict[str, Any], Page]:
        """The session view and the raw events of one page, read CHUNK at a time (one more than the page
        needs, to know whether more exist)."""
        page, want = Page(limit, page_bytes(self.settings.ws_send_buffer)), min(limit, CHUNK) + 1
        session, members = await self.read(namespace, session_id, since, want)
        events_key = keys.session_keys(namespace, session_id).events
        # Stop when one did not fit (the page is full and more exist) or Redis had fewer than asked (no more).
        while all(page.add(member) for member in members) and len(members) == want:
            want = min(page.room(), CHUNK) + 1
            members = await self._events_after(events_key, seq_of(page.items[-1]), want)
        return session, page

    async def _events_after(self, events_key: str, seq: int, count: int) -> list[str]:
        """Up to `count` stored events with a seq above `seq`, raw."""
        members: list[Any] = await self.redis.zrangebyscore(events_key, f"({seq}", "+inf", start=0, num=count)
        return members

    async def _condensed(self, namespace: str, session_id: str) -> dict[str, Any]:
        """The summary of every event, folded CHUNK events at a time so neither memory nor one decode grows
        with the session."""
        folder, conversation = Condenser(), ConversationFold()
        session, members = await self.read(namespace, session_id, 0, CHUNK)
        events_key = keys.session_keys(namespace, session_id).events
        while members:
            events = [pydantic_core.from_json(member) for member in members]
            folder.add(events)
            conversation.add(events)  # an ingested agent's tools, prompts, todos and tasks
            if len(members) < CHUNK:
                break
            members = await self._events_after(events_key, seq_of(members[-1]), CHUNK)
        return {"session": session, **folder.result(), **conversation.condensed(),
                "lastCheckpoint": session["lastCheckpoint"],
                "usage": (await session_totals(self.redis, namespace, session_id))["totals"]}

    async def view(self, namespace: str, session_id: str) -> dict[str, Any]:
        """The session view alone (no events)."""
        session, _ = await self._read(namespace, session_id, None)
        return session

    async def read(self, namespace: str, session_id: str, since: int = 0,
                   limit: int | None = None) -> tuple[dict[str, Any], list[str]]:
        """The session view and its raw stored events with seq > since (at most `limit`), in one transaction."""
        return await self._read(namespace, session_id, events_after(since, limit))

    async def tail(self, namespace: str, session_id: str, count: int) -> tuple[dict[str, Any], list[str]]:
        """The session view and its last `count` raw stored events, in one transaction."""
        return await self._read(namespace, session_id, last_events(count))

    async def _read(self, namespace: str, session_id: str,
                    events: EventRange | None) -> tuple[dict[str, Any], list[str]]:
        """Every single-session read: the view and, with `events`, a range of the raw stored events, in one
        MULTI (the session's keys share a hash tag, so it is one slot on a cluster); NotFound once expired."""
        skeys = keys.session_keys(namespace, session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            ask_view(pipe, skeys)
            if events is not None:
                events(pipe, skeys.events)
            replies = await pipe.execute()
        session = view_of(session_id, replies[:VIEW_READS])
        if session is None:
            raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})
        return session, replies[VIEW_READS] if events is not None else []

    async def list_sessions(self, namespace: str, *, state: str | None = None, agent_id: str | None = None,
                            limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        """A page of the namespace's sessions, newest first, from the index (never KEYS or SCAN), and
        `nextCursor` when more may follow: the page stops at `limit`, at a quarter of the send buffer in
        bytes, or after LIST_SCAN index entries (a filter that matches few sessions pages too)."""
        page = Page(limit, page_bytes(self.settings.ws_send_buffer))
        top, after = parse_cursor(cursor)
        index, offset, last = keys.session_index(namespace), 0, after
        while offset < LIST_SCAN:
            fetched: list[Any] = await self.redis.zrevrangebyscore(index, top, "-inf", start=offset,
                                                                   num=LIST_CHUNK, withscores=True)
            offset += len(fetched)
            rows = [(str(sid), int(score)) for sid, score in fetched if not before_cursor(str(sid), int(score), after)]
            views = await self._views(namespace, [sid for sid, _ in rows])
            for (sid, score), view in zip(rows, views, strict=True):
                if view and matches(view, state, agent_id) and not page.add(view):
                    return self._listed(page, last)
                last = (score, sid)
            if len(fetched) < LIST_CHUNK:
                return self._listed(page, None)  # the index ended
        return self._listed(page, last)

    @staticmethod
    def _listed(page: Page, last: tuple[int, str] | None) -> dict[str, Any]:
        result: dict[str, Any] = {"sessions": page.items}
        if last is not None:
            result["nextCursor"] = f"{last[0]}:{last[1]}"
            REPLY_PAGES.labels("session.list").inc()
        return result

    async def _views(self, namespace: str, ids: list[str]) -> list[dict[str, Any] | None]:
        """The views of several sessions (None for one that expired) in one round trip, not one transaction:
        their keys lie in different slots on a cluster."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in ids:
                ask_view(pipe, keys.session_keys(namespace, sid))
            replies = await pipe.execute()
        return [view_of(sid, replies[VIEW_READS * i: VIEW_READS * (i + 1)]) for i, sid in enumerate(ids)]
