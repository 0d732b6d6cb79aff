"""`Client`: the async Python client of the `/ws` JSON-RPC API (SPEC section 6).

One WebSocket per client. A reader task routes replies to the requests waiting for them (several may
be in flight) and notifications to subscriptions. When the connection drops, requests in flight fail
with ConnectionLost; reads, and emits whose events all carry an idempotency `id`, are sent again once
the client has reconnected (with jittered exponential backoff), and every subscription resumes after the
last seq it delivered, with the last epoch it saw. Design notes: docs/client.md.

MementoError
 +-- RpcError and its subclasses     the server's JSON-RPC errors (memento_sessions.errors)
 +-- ConnectionLost                  the connection dropped before the reply (also a ConnectionError)
 |    +-- ClientClosed               the client was closed, or gave up reconnecting
 +-- RequestTimeout                  no reply within request_timeout (also a TimeoutError)
 +-- RequestTooLarge                 the request frame is over the server's 1 MiB limit (also a ValueError)
 +-- Unauthorized                    the handshake was refused: bad or expired token
 +-- HistoryLost                     a subscription cannot resume without a gap (server said recovered: false)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Self, TypeVar

import anyio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from memento_sessions import errors
from memento_sessions.errors import MementoError, RpcError
from memento_sessions.logs import get_logger

log = get_logger(__name__)
T = TypeVar("T")
Result = dict[str, Any]
MAX_FRAME = 1024 * 1024
RETRIES = 5
_ERRORS: dict[int, type[RpcError]] = {cls.code: cls for cls in (
    errors.ParseError, errors.InvalidRequest, errors.MethodNotFound, errors.InvalidParams, errors.Forbidden,
    errors.NotFound, errors.Conflict, errors.RateLimited, errors.BackendUnavailable)}


class ConnectionLost(MementoError, ConnectionError):
    """The connection dropped before the reply came; the request may or may not have been applied."""


class ClientClosed(ConnectionLost):
    """The client is closed (or stopped reconnecting); nothing more can be sent."""


class RequestTimeout(MementoError, TimeoutError):
    """No reply within `request_timeout` seconds."""


class RequestTooLarge(MementoError, ValueError):
    """The request is over the server's frame limit (it would close the connection with 1009)."""


class Unauthorized(MementoError):
    """The server refused the handshake: the token is missing, forged or expired."""


class HistoryLost(MementoError):
    """A subscription resumed after a gap it cannot fill; iterating again continues live after `seq`."""

    def __init__(self, session_id: str, last_seq: int | None, seq: int, epoch: str | None) -> None:
        super().__init__(f"session {session_id}: events after seq {last_seq} cannot be replayed "
                         f"(history lost; epoch is now {epoch}, seq {seq})")
        self.session_id, self.last_seq, self.seq, self.epoch = session_id, last_seq, seq, epoch


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a subscription, as the server stored it (`event` has seq, actor, timestamp ...)."""

    session_id: str
    seq: int
    event: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.event.get("type", ""))


def rpc_error(error: Mapping[str, Any]) -> RpcError:
    """The RpcError subclass of a JSON-RPC error object (code kept as sent when unknown)."""
    code = int(error.get("code", -32603))
    exc = _ERRORS.get(code, RpcError)(str(error.get("message", "")), error.get("data"))
    exc.code = code
    return exc


def backoff_delay(attempt: int, first: float, cap: float) -> float:
    """Exponential backoff with jitter: somewhere in the upper half of min(cap, first * 2**attempt)."""
    ceiling = min(cap, first * 2 ** min(attempt, 30))
    return random.uniform(ceiling / 2, ceiling)


def token_source(token: str | Callable[[], str]) -> Callable[[], str]:
    """A callable giving the token for each handshake (a callable lets a client refresh its token)."""
    if callable(token):
        return token
    return lambda: token


def compact(**params: Any) -> Result:
    """The params object without the arguments left at None."""
    return {name: value for name, value in params.items() if value is not None}


def encode(value: object) -> object:
    """JSON for what `json` cannot encode alone: any Mapping, and datetimes (ISO-8601)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot send a {type(value).__name__} as JSON")


class _Feed(Generic[T]):
    """A bounded queue of notifications read by one consumer; an error in it is raised when reached."""

    def __init__(self, client: Client, limit: int) -> None:
        self.client = client
        self._items: deque[T | BaseException] = deque()
        self._limit = limit
        self._wake = anyio.Event()
        self._ended = False
        self._started = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        await self.start()
        return await self._next()

    async def start(self) -> None:
        """Ask the server for the notifications (once); raises its error, e.g. NotFound."""
        if not self._started:
            self._started = True
            try:
                await self._open()
            except BaseException:
                self._end()
                raise

    async def aclose(self) -> None:
        """Stop receiving; safe to call twice."""
        self._items.clear()
        self._end()
        await self._close()

    async def _open(self) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    @property
    def full(self) -> bool:
        return len(self._items) >= self._limit

    def _push(self, item: T | BaseException) -> None:
        self._items.append(item)
        self._wake.set()

    def _end(self, error: BaseException | None = None) -> None:
        """No more items after those queued (then `error`, when given)."""
        if error is not None and not self._ended:
            self._items.append(error)
        self._ended = True
        self._wake.set()

    async def _idle(self) -> None:
        """Called when the queue is empty and not ended: wait for a push."""
        self._wake = anyio.Event()
        await self._wake.wait()

    async def _next(self) -> T:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            await self._idle()
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item


class Subscription(_Feed[Event]):
    """The events of one session in seq order, each once, across reconnects (`async with` or `async for`)."""

    def __init__(self, client: Client, session_id: str, since: int | None, epoch: str | None, limit: int) -> None:
        super().__init__(client, limit)
        self.session_id = session_id
        self.last_seq = since  # the seq to resume after: the last one queued, else where live began
        self.epoch = epoch
        self.last_checkpoint: Result | None = None
        self.resyncs = 0  # times the queue overflowed or a gap showed, and the stream was fetched again
        self._on: ClientConnection | None = None  # the connection the server subscription lives on
        self._early: list[Result] | None = None  # events that came before the subscribe reply
        self._stale = False

    async def _open(self) -> None:
        await self.client._open_subscription(self)

    async def _close(self) -> None:
        await self.client._close_subscription(self)

    async def _idle(self) -> None:
        if not self._stale:
            await super()._idle()
            return
        with suppress(ConnectionLost):  # still disconnected: _next calls again; closed: _next ends
            await self.client._resync(self)

    def _expect(self, ws: ClientConnection) -> None:
        """A subscribe request is about to go out on `ws`: hold events until its reply."""
        self._on, self._early, self._stale = ws, [], False

    def _detach(self) -> None:
        self._on, self._early = None, None

    def _activate(self, result: Mapping[str, Any], asked_since: int | None) -> None:
        """The server's subscribe reply: note where we stand, then the events that came early."""
        early, self._early = self._early or [], None
        if result.get("recovered") is False and asked_since is not None:
            self._push(HistoryLost(self.session_id, asked_since, int(result["seq"]), result.get("epoch")))
            self.last_seq = None
        if self.last_seq is None:
            self.last_seq = int(result["seq"])
        self.epoch = result.get("epoch", self.epoch)
        for params in early:
            self._on_event(params)

    def _on_event(self, params: Result) -> None:
        if self._early is not None:
            self._early.append(params)
            return
        seq = int(params["seq"])
        epoch = params.get("epoch")
        if epoch and self.epoch and epoch != self.epoch and not self._stale and not self._ended:
            # The session was created anew under this id while we were subscribed: its history restarted.
            self._push(HistoryLost(self.session_id, self.last_seq, seq, epoch))
            self.epoch, self.last_seq = epoch, 0
        if self._stale or self._ended or (self.last_seq is not None and seq <= self.last_seq):
            return
        if self.full or (self.last_seq is not None and seq != self.last_seq + 1):
            self._go_stale(seq)
            return
        self.last_seq = seq
        self._push(Event(self.session_id, seq, params["event"]))

    def _go_stale(self, seq: int) -> None:
        """Drop events until the consumer has caught up, then subscribe again after `last_seq`."""
        log.warning("subscription resyncs", session_id=self.session_id, seq=seq, last_seq=self.last_seq,
                    queued=len(self._items))
        self._stale = True
        self.resyncs += 1
        self._wake.set()


class Watch(_Feed[Result]):
    """`sessions.announce` notifications (`async with` or `async for`); see docs/client.md on gaps."""

    def __init__(self, client: Client, limit: int) -> None:
        super().__init__(client, limit)
        self.dropped = 0  # announcements dropped because the queue was full (the oldest go first)

    async def _open(self) -> None:
        await self.client._open_watch(self)

    async def _close(self) -> None:
        self.client._watches.discard(self)  # the server has no unwatch: it announces until the connection ends

    def _announce(self, params: Result) -> None:
        if self.full:
            self._items.popleft()
            self.dropped += 1
        self._push(params)


class Client:
    """An async client of one daemon's `/ws`: `async with Client(url, token) as client: ...`."""

    def __init__(self, url: str, token: str | Callable[[], str], *, reconnect: bool = True,
                 backoff: tuple[float, float] = (0.05, 5.0), request_timeout: float = 10.0,
                 max_queue: int = 10_000) -> None:
        self.url = url
        self._token = token_source(token)
        self._reconnect, self._backoff, self._timeout, self._max_queue = reconnect, backoff, request_timeout, max_queue
        self._ws: ClientConnection | None = None
        self._up = anyio.Event()
        self._dropped = anyio.Event()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Result]] = {}
        self._subs: dict[str, Subscription] = {}
        self._watches: set[Watch] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed: ClientClosed | None = None
        self.reconnects = 0
        self.last_close_code: int | None = None

    @property
    def connection(self) -> ClientConnection | None:
        """The WebSocket in use now (None while reconnecting); for diagnostics and tests."""
        return self._ws

    async def __aenter__(self) -> Client:
        self._ws = await self._open()
        self._up.set()
        # A task of its own, not a task group: the client may then be closed from any task or scope.
        self._task = asyncio.create_task(self._supervise(self._ws), name=f"memento-client {self.url}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection, fail pending requests, end subscriptions; safe to call twice."""
        self._finish(ClientClosed("client closed"), None)
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
        if self._ws is not None:
            await self._ws.close()

    # -- the connection -------------------------------------------------------------------------------------

    async def _open(self) -> ClientConnection:
        headers = {"Authorization": f"Bearer {self._token()}"}
        try:
            return await connect(self.url, additional_headers=headers, max_size=None, compression=None,
                                 open_timeout=self._timeout)
        except InvalidStatus as exc:
            if exc.response.status_code in (401, 403):
                raise Unauthorized(f"handshake refused with HTTP {exc.response.status_code}") from exc
            raise

    async def _supervise(self, ws: ClientConnection) -> None:
        try:
            await self._run(ws)
        except Exception as exc:  # a bug must not leave callers waiting forever
            log.exception("client failed", url=self.url)
            self._finish(ClientClosed(f"client failed: {exc!r}"), exc)

    async def _run(self, ws: ClientConnection | None) -> None:
        """Read the connection until it drops, then reconnect and restore, until closed."""
        while ws is not None:
            async with anyio.create_task_group() as tg:
                if self.reconnects:
                    tg.start_soon(self._restore, ws)
                await self._read(ws)
                tg.cancel_scope.cancel()
            self._drop(ws)
            ws = await self._redial() if self._reconnect and self._closed is None else None
        if self._closed is None:
            lost = ClientClosed(f"connection lost (close code {self.last_close_code}) and reconnect is off")
            self._finish(lost, lost)

    async def _read(self, ws: ClientConnection) -> None:
        with suppress(ConnectionClosed):
            async for frame in ws:
                self._dispatch(frame)
        self.last_close_code = ws.close_code

    def _drop(self, ws: ClientConnection) -> None:
        """The connection is gone: fail what waits on it and forget the server's subscriptions."""
        log.info("connection lost", url=self.url, close_code=ws.close_code)
        self._up.set()  # wakes those waiting for a restore on `ws`; they wait again on the new event
        self._ws, self._up = None, anyio.Event()
        self._dropped.set()
        self._fail_pending(ConnectionLost(f"connection lost (close code {ws.close_code})"))
        for sub in self._subs.values():
            sub._detach()

    def _fail_pending(self, error: ConnectionLost) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def _redial(self) -> ClientConnection | None:
        """Reconnect with backoff; None when the token is refused."""
        for attempt in itertools.count():
            await anyio.sleep(backoff_delay(attempt, *self._backoff))
            try:
                ws = await self._open()
            except Unauthorized as exc:
                self._finish(ClientClosed(str(exc)), exc)
                return None
            except (OSError, TimeoutError, WebSocketException) as exc:
                log.info("reconnect failed", url=self.url, attempt=attempt, error=str(exc))
                continue
            return self._connected(ws)
        raise AssertionError("unreachable")  # pragma: no cover

    def _connected(self, ws: ClientConnection) -> ClientConnection:
        self._ws, self._dropped = ws, anyio.Event()
        self.reconnects += 1
        return ws

    async def _restore(self, ws: ClientConnection) -> None:
        """On a new connection: watch again and resume every subscription, then let requests through."""
        with suppress(ConnectionLost):  # the next connection restores again
            if self._watches:
                await self._rewatch(ws)
            for sub in list(self._subs.values()):
                await self._subscribe_quietly(sub, ws)
        if self._ws is ws:
            self._up.set()

    async def _rewatch(self, ws: ClientConnection) -> None:
        try:
            await self._request_on(ws, "sessions.watch", {})
        except RequestTimeout:
            await self._abandon(ws, "sessions.watch")
        except RpcError as exc:
            for watch in self._watches:
                watch._end(exc)
            self._watches.clear()

    async def _abandon(self, ws: ClientConnection, method: str) -> None:
        """A restoring request timed out: drop this connection, so the next one restores everything."""
        log.warning("no reply while restoring; reconnecting", url=self.url, method=method)
        await ws.close(1011, f"{method} timed out")
        raise ConnectionLost(f"{method} timed out")

    def _finish(self, closed: ClientClosed, error: BaseException | None) -> None:
        """No more connections: wake waiters and end every feed (with `error`, when there is one)."""
        self._closed = self._closed or closed
        self._up.set()
        self._dropped.set()
        self._fail_pending(self._closed)
        feeds: list[_Feed[Any]] = [*self._subs.values(), *self._watches]
        for feed in feeds:
            feed._end(error)
        self._subs.clear()
        self._watches.clear()

    async def _connection(self) -> ClientConnection:
        """The live connection, waiting up to request_timeout while it reconnects and restores."""
        if self._task is None:
            raise ClientClosed("the client is not open: use `async with Client(...) as client`")
        with anyio.move_on_after(self._timeout):
            while not self._up.is_set():
                await self._up.wait()
        if self._closed is not None:
            raise self._closed
        if self._ws is None or not self._up.is_set():
            raise ConnectionLost(f"not reconnected within {self._timeout} s")
        return self._ws

    # -- requests and notifications -------------------------------------------------------------------------

    def _dispatch(self, frame: str | bytes) -> None:
        try:
            self._route(json.loads(frame))
        except (ValueError, LookupError, TypeError, AttributeError) as exc:
            log.warning("unreadable frame from server", url=self.url, error=repr(exc))

    def _route(self, message: Result) -> None:
        if "method" in message:
            self._notify(message["method"], message.get("params") or {})
        elif (future := self._pending.pop(int(message["id"]), None)) is not None and not future.done():
            if "error" in message:
                future.set_exception(rpc_error(message["error"]))
            else:
                future.set_result(message.get("result") or {})

    def _notify(self, method: str, params: Result) -> None:
        sub = self._subs.get(params.get("sessionId", ""))
        if method == "session.event" and sub is not None:
            sub._on_event(params)
        elif method == "session.checkpoint" and sub is not None:
            sub.last_checkpoint = params
        elif method == "sessions.announce":
            for watch in self._watches:
                watch._announce(params)

    async def call(self, method: str, params: Mapping[str, Any] | None = None, *, retry: bool = False) -> Result:
        """Any method by name; with `retry`, sent again after a reconnect (only for idempotent calls)."""
        for attempt in itertools.count():
            ws = await self._connection()
            try:
                return await self._request_on(ws, method, params or {})
            except ConnectionLost:
                if not retry or attempt >= RETRIES:
                    raise
            if self._ws is ws:  # wait for the reader to notice, so the retry goes out on the next connection
                await self._dropped.wait()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _request_on(self, ws: ClientConnection, method: str, params: Mapping[str, Any]) -> Result:
        """Send one request on `ws` (which must still be the live connection) and await its reply."""
        request_id = next(self._ids)
        frame = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, default=encode)
        if len(frame.encode()) > MAX_FRAME:
            raise RequestTooLarge(f"{method} request is over {MAX_FRAME} bytes")
        if ws is not self._ws:
            raise ConnectionLost("connection lost")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await ws.send(frame)
            with anyio.fail_after(self._timeout):
                return await future
        except ConnectionClosed as exc:
            raise ConnectionLost(f"connection lost (close code {ws.close_code})") from exc
        except TimeoutError:
            raise RequestTimeout(f"no reply to {method} within {self._timeout} s") from None
        finally:
            self._pending.pop(request_id, None)

    # -- subscriptions --------------------------------------------------------------------------------------

    def subscribe(self, session_id: str, since: int | None = None, epoch: str | None = None) -> Subscription:
        """Events of a session: after `since` (replayed from history), else from now; see Subscription."""
        return Subscription(self, session_id, since, epoch, self._max_queue)

    def watch(self) -> Watch:
        """Announcements of new, checkpointed and completed sessions in the token's namespace."""
        return Watch(self, self._max_queue)

    async def _open_subscription(self, sub: Subscription) -> None:
        if sub.session_id in self._subs:
            raise ValueError(f"this client is already subscribed to {sub.session_id}")
        self._subs[sub.session_id] = sub
        try:
            await self._subscribe_on(sub, await self._connection())
        except ConnectionLost:
            if self._closed is None:
                return  # the next connection subscribes it
            self._subs.pop(sub.session_id, None)
            raise
        except BaseException:
            self._subs.pop(sub.session_id, None)
            raise

    async def _subscribe_on(self, sub: Subscription, ws: ClientConnection) -> None:
        """Subscribe `sub` on `ws` after its last seq (unless it already is)."""
        if sub._on is ws:
            return
        since = sub.last_seq
        sub._expect(ws)
        try:
            result = await self._request_on(ws, "session.subscribe",
                                            compact(sessionId=sub.session_id, since=since, epoch=sub.epoch))
        except BaseException:
            if sub._on is ws:
                sub._detach()
            raise
        if sub._on is not ws:
            raise ConnectionLost("connection lost")
        sub._activate(result, since)

    async def _subscribe_quietly(self, sub: Subscription, ws: ClientConnection) -> None:
        """Resubscribe; an error from the server (the session expired, say) ends `sub` with it."""
        try:
            await self._subscribe_on(sub, ws)
        except RequestTimeout:
            await self._abandon(ws, "session.subscribe")
        except RpcError as exc:
            self._subs.pop(sub.session_id, None)
            sub._end(exc)

    async def _resync(self, sub: Subscription) -> None:
        """Fetch the stream again after the last queued seq, on the same connection."""
        ws = await self._connection()
        if not sub._stale:
            return
        if sub._on is ws:
            with suppress(MementoError):
                await self._request_on(ws, "session.unsubscribe", {"sessionId": sub.session_id})
        if sub._on is ws:
            sub._detach()
        with suppress(ConnectionLost):
            await self._subscribe_quietly(sub, ws)

    async def _close_subscription(self, sub: Subscription) -> None:
        if self._subs.get(sub.session_id) is not sub:
            return
        del self._subs[sub.session_id]
        ws, sub._on = sub._on, None
        if ws is not None and ws is self._ws:
            with suppress(MementoError):
                await self._request_on(ws, "session.unsubscribe", {"sessionId": sub.session_id})

    async def _open_watch(self, watch: Watch) -> None:
        self._watches.add(watch)
        if len(self._watches) == 1:
            try:
                await self.call("sessions.watch", retry=True)
            except BaseException:
                self._watches.discard(watch)
                raise

    # -- the methods of SPEC section 6 ----------------------------------------------------------------------

    async def create_session(self, entity_ids: Sequence[str] | None = None, *, session_id: str | None = None,
                             ttl: int | None = None, labels: Mapping[str, str] | None = None) -> Result:
        """`session.create`: {sessionId, state, seq, agentIds, expiresAt}."""
        return await self.call("session.create", compact(entityIds=entity_ids, sessionId=session_id, ttl=ttl,
                                                         labels=labels))

    async def join(self, session_id: str) -> Result:
        """`session.join`: {sessionId, agentIds, state, seq}."""
        return await self.call("session.join", {"sessionId": session_id}, retry=True)

    async def leave(self, session_id: str) -> Result:
        """`session.leave`: {}."""
        return await self.call("session.leave", {"sessionId": session_id}, retry=True)

    async def get(self, session_id: str, *, condensed: bool = False, since: int | None = None,
                  limit: int | None = None) -> Result:
        """`session.get`: {session, events}, or the condensed view."""
        params = compact(sessionId=session_id, condensed=condensed or None, since=since, limit=limit)
        return await self.call("session.get", params, retry=True)

    async def list_sessions(self, *, state: str | None = None, agent_id: str | None = None,
                            limit: int | None = None) -> list[Result]:
        """`session.list`: the sessions, newest first."""
        result = await self.call("session.list", compact(state=state, agentId=agent_id, limit=limit), retry=True)
        sessions: list[Result] = result["sessions"]
        return sessions

    async def emit(self, session_id: str, event: Mapping[str, Any]) -> Result:
        """`event.emit`: {seq, duplicate}; retried across a reconnect only when the event has an `id`."""
        params = {"sessionId": session_id, "event": event}
        return await self.call("event.emit", params, retry="id" in event)

    async def emit_batch(self, session_id: str, events: Sequence[Mapping[str, Any]]) -> Result:
        """`event.emitBatch`: {seqs}; retried across a reconnect only when every event has an `id`."""
        params = {"sessionId": session_id, "events": events}
        return await self.call("event.emitBatch", params, retry=all("id" in event for event in events))

    async def checkpoint(self, session_id: str, *, final: bool = False) -> Result:
        """`session.checkpoint`: {checkpointId, outcome, brokeDuring, keyImpacts, perfDelta, actors, ...}."""
        return await self.call("session.checkpoint", compact(sessionId=session_id, final=final or None))

    async def transitions(self, session_id: str, entity_id: str | None = None) -> list[Result]:
        """`bridge.transitions`: [{fromSeq, toSeq, changeInfo, impact, kgContext?}]."""
        result = await self.call("bridge.transitions", compact(sessionId=session_id, entityId=entity_id),
                                 retry=True)
        transitions: list[Result] = result["transitions"]
        return transitions

    async def isolate(self, session_id: str, agent_id: str) -> Result:
        """`bridge.isolate`: {agentId, events, impacts, totalPerfDelta}."""
        return await self.call("bridge.isolate", {"sessionId": session_id, "agentId": agent_id}, retry=True)

    async def handoff(self, session_id: str) -> Result:
        """`bridge.handoff`: {sessionId, state, agentIds, recentChanges, kgContext, joiningAdvice}."""
        return await self.call("bridge.handoff", {"sessionId": session_id}, retry=True)

    async def outcomes(self, cluster_id: str, days: int | None = None) -> Result:
        """`bridge.outcomes`: {clusterName, specTitles, recentSessions, avgPerfDelta, brokenCount}."""
        return await self.call("bridge.outcomes", compact(clusterId=cluster_id, days=days), retry=True)

    async def kg_upsert(self, nodes: Sequence[Mapping[str, Any]] | None = None,
                        edges: Sequence[Mapping[str, Any]] | None = None) -> Result:
        """`kg.upsert` (scope kg:write): {nodes, edges} counts; upserts are idempotent, so retried."""
        return await self.call("kg.upsert", compact(nodes=nodes, edges=edges), retry=True)
