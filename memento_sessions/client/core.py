"""`Client`: one WebSocket to the daemon, its reader, reconnects, and the requests and feeds on it.

A reader task routes replies to the requests waiting for them (several may be in flight) and
notifications to subscriptions. When the connection drops, requests in flight fail with ConnectionLost;
reads, and emits whose events all carry an idempotency `id`, are sent again once the client has
reconnected (with jittered exponential backoff), and every subscription resumes after the last seq it
delivered, with the last epoch it saw. The typed methods of the API are in methods.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

import anyio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from memento_sessions.client.backoff import RETRIES, backoff_delay
from memento_sessions.client.errors import (
    ClientClosed,
    ConnectionLost,
    RequestTimeout,
    RequestTooLarge,
    Unauthorized,
    rpc_error,
)
from memento_sessions.client.feeds import Feed, Link, Subscription, Watch
from memento_sessions.client.methods import Methods
from memento_sessions.client.wire import MAX_FRAME, Result, compact, encode, token_source
from memento_sessions.errors import BackendUnavailable, MementoError, RateLimited, RpcError
from memento_sessions.logs import get_logger

log = get_logger("memento_sessions.client")  # the logger name the client had as one module
PASSING = (BackendUnavailable, RateLimited)  # refusals that a later try may not get


def refusal_reason(body: bytes | bytearray | None) -> str:
    """The reason the daemon gave for refusing a handshake (its `{"error": ...}` body), else the body as text."""
    text = (body or b"").decode("utf-8", "replace").strip()
    try:
        reason = json.loads(text).get("error")
    except (ValueError, AttributeError):
        reason = None
    return str(reason) if reason else (text[:200] or "no reason given")


class Client(Methods):
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
                raise Unauthorized(f"handshake refused with HTTP {exc.response.status_code}: "
                                   f"{refusal_reason(exc.response.body)}") from exc
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
            sub.detach()

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
                watch.end(exc)
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
        feeds: list[Feed[Any]] = [*self._subs.values(), *self._watches]
        for feed in feeds:
            feed.end(error)
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
            sub.deliver(params)
        elif method == "session.recovery" and sub is not None:
            sub.recover(params)
        elif method == "session.checkpoint" and sub is not None:
            sub.last_checkpoint = params
        elif method == "sessions.announce":
            for watch in self._watches:
                watch.deliver(params)

    async def call(self, method: str, params: Mapping[str, Any] | None = None, *, retry: bool = False) -> Result:
        """Any method by name; with `retry`, sent again after a reconnect (only for idempotent calls)."""
        return await self._call(method, json.dumps(params or {}, default=encode).encode(), retry)

    async def emit_batch_encoded(self, session_id: str, events: Sequence[bytes]) -> Result:
        """`event.emitBatch` of events already encoded (each a JSON object, UTF-8): the request is their bytes
        joined, never decoded or encoded again. Retried across a reconnect only when every event carries an
        idempotency `id` as its first key (`{"id":`, as the ingest converters write them); RequestTooLarge
        when the request is over MAX_FRAME bytes."""
        params = b'{"sessionId":%b,"events":[%b]}' % (json.dumps(session_id).encode(), b",".join(events))
        return await self._call("event.emitBatch", params, all(event.startswith(b'{"id":') for event in events))

    async def _call(self, method: str, params: bytes, retry: bool) -> Result:
        """`call` with the params object already encoded."""
        for attempt in itertools.count():
            ws = await self._connection()
            try:
                return await self._request_on(ws, method, params)
            except ConnectionLost:
                if not retry or attempt >= RETRIES:
                    raise
            if self._ws is ws:  # wait for the reader to notice, so the retry goes out on the next connection
                await self._dropped.wait()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _request_on(self, ws: ClientConnection, method: str, params: Mapping[str, Any] | bytes) -> Result:
        """Send one request on `ws` (which must still be the live connection) and await its reply; `params`
        may be already encoded, then it goes into the frame as it is."""
        request_id = next(self._ids)
        if not isinstance(params, bytes):
            params = json.dumps(params, default=encode).encode()
        frame = b'{"jsonrpc":"2.0","id":%d,"method":%b,"params":%b}' % (request_id, json.dumps(method).encode(),
                                                                         params)
        if len(frame) > MAX_FRAME:
            raise RequestTooLarge(f"{method} request is over {MAX_FRAME} bytes")
        if ws is not self._ws:
            raise ConnectionLost("connection lost")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await ws.send(frame, text=True)  # UTF-8 already: a text frame without encoding it again
            with anyio.fail_after(self._timeout):
                return await future
        except ConnectionClosed as exc:
            raise ConnectionLost(f"connection lost (close code {ws.close_code})") from exc
        except TimeoutError:
            raise RequestTimeout(f"no reply to {method} within {self._timeout} s") from None
        finally:
            self._pending.pop(request_id, None)
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # failed while `send` was cut: read, so asyncio never reports it unretrieved

    # -- subscriptions --------------------------------------------------------------------------------------

    def subscribe(self, session_id: str, since: int | None = None, epoch: str | None = None) -> Subscription:
        """Events of a session: after `since` (replayed from history), else from now; see Subscription."""
        return Subscription(self, session_id, since, epoch, self._max_queue)

    def watch(self) -> Watch:
        """Announcements of new, checkpointed and completed sessions in the token's namespace."""
        return Watch(self, self._max_queue)

    # -- what the feeds ask of the client that handed them out ---------------------------------------------

    async def open_subscription(self, sub: Subscription) -> None:
        """Register `sub` and subscribe it on the live connection (else the next one subscribes it)."""
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
        if sub.connection is ws:
            return
        since = sub.last_seq
        sub.asking(ws)
        try:
            result = await self._request_on(ws, "session.subscribe",
                                            compact(sessionId=sub.session_id, since=since, epoch=sub.epoch))
        except BaseException:
            if sub.connection is ws:
                sub.detach()
            raise
        if sub.connection is not ws:
            raise ConnectionLost("connection lost")
        sub.answered(result, since)

    async def _subscribe_quietly(self, sub: Subscription, ws: ClientConnection) -> None:
        """Resubscribe. A passing refusal (backend unavailable, rate limited) is retried with backoff, then
        on a new connection; any other error from the server (the session expired, say) ends `sub` with it."""
        for attempt in itertools.count():
            try:
                await self._subscribe_on(sub, ws)
                return
            except RequestTimeout:
                await self._abandon(ws, "session.subscribe")
            except PASSING as exc:
                if attempt >= RETRIES and not isinstance(exc, RateLimited):  # the rate limit says when: no cap
                    await self._abandon(ws, "session.subscribe")
                log.info("resubscribe refused for now; retrying", session_id=sub.session_id, error=str(exc))
                await anyio.sleep(retry_delay(exc, attempt, self._backoff))
            except RpcError as exc:
                self._subs.pop(sub.session_id, None)
                sub.end(exc)
                return

    async def resync(self, sub: Subscription) -> None:
        """A STALE `sub` whose consumer caught up: fetch the stream again after its last queued seq."""
        ws = await self._connection()
        if sub.link is not Link.STALE:
            return
        if sub.connection is ws:
            with suppress(MementoError):
                await self._request_on(ws, "session.unsubscribe", {"sessionId": sub.session_id})
        if sub.connection is ws:
            sub.detach()
        with suppress(ConnectionLost):
            await self._subscribe_quietly(sub, ws)

    async def close_subscription(self, sub: Subscription) -> None:
        """Forget `sub` and unsubscribe it on the server, when it is subscribed on the live connection."""
        if self._subs.get(sub.session_id) is not sub:
            return
        del self._subs[sub.session_id]
        ws = sub.connection
        sub.detach()
        if ws is not None and ws is self._ws:
            with suppress(MementoError):
                await self._request_on(ws, "session.unsubscribe", {"sessionId": sub.session_id})

    async def open_watch(self, watch: Watch) -> None:
        """Register `watch`; the first one asks the server to watch (again after every reconnect)."""
        self._watches.add(watch)
        if len(self._watches) == 1:
            try:
                await self.call("sessions.watch", retry=True)
            except BaseException:
                self._watches.discard(watch)
                raise

    def close_watch(self, watch: Watch) -> None:
        """Forget `watch`: the server has no unwatch, it announces until the connection ends."""
        self._watches.discard(watch)


def retry_delay(exc: RpcError, attempt: int, backoff: tuple[float, float]) -> float:
    """How long to wait before trying again: the server's retryAfterMs when it gave one, else backoff."""
    data = exc.data if isinstance(exc.data, dict) else {}
    after = data.get("retryAfterMs")
    wait = backoff_delay(attempt, *backoff)
    return max(wait, float(after) / 1000) if isinstance(after, int | float) else wait
