"""The `/ws` endpoint: authenticate the handshake, then serve JSON-RPC over one WebSocket.

Each connection has a reader (requests, answered in the order sent) and a writer fed by a
bounded buffer. Fan-out only ever appends to that buffer; a client whose buffer overflows is
closed with 4008 instead of slowing the publisher (see docs/flow-control.md).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import anyio
import structlog
from starlette.types import Receive, Scope, Send

from memento_sessions.auth import AuthError, Identity, bearer, verify_token
from memento_sessions.logs import get_logger
from memento_sessions.metrics import WS_CONNECTIONS, WS_MESSAGES_SENT, WS_REFUSED, WS_SLOW_CLOSES
from memento_sessions.ratelimit import TokenBucket
from memento_sessions.rpc import Call, Registry, handle_frame
from memento_sessions.wsframes import DirectWriter, take_batch

log = get_logger(__name__)
SLOW_CONSUMER = 4008
TOKEN_EXPIRED = 4001
GOING_AWAY = 1001
CLOSE_TIMEOUT = 5.0


class Connection:
    """One authenticated client; `notify` never blocks, the writer drains the buffer.

    The buffer bound covers everything the daemon keeps for this client: frames queued for the writer and
    live frames a subscription holds back while it replays (`hold`). One frame always fits in an empty
    buffer, whatever its size, so a frame bigger than the buffer neither wedges a replay nor closes a
    client that reads everything.
    """

    def __init__(self, send: Send, identity: Identity, limit_bytes: int) -> None:
        self.conn_id = uuid.uuid4().hex[:12]
        self.identity = identity
        self._send = send
        self._direct = DirectWriter.behind(send)
        self._sending = False
        self._limit = limit_bytes
        self._out: deque[str] = deque()
        self._queued = 0
        self._held = 0
        self._wakeup = anyio.Event()
        self._drained = anyio.Event()
        self._cleanups: list[Callable[[], None]] = []
        self.close_code: int | None = None
        self.close_reason = ""

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting for the writer plus bytes held back by replaying subscriptions."""
        return self._queued + self._held

    def _fits(self, nbytes: int) -> bool:
        used = self._queued + self._held
        return used == 0 or used + nbytes <= self._limit

    def notify(self, frame: str) -> None:
        """Queue a frame; a client whose buffer would overflow is closed as a slow consumer."""
        if self.close_code is not None:
            return
        if not self._fits(len(frame)):
            self._overflow()
            return
        if self._direct is not None and not self._out and not self._sending and self._direct.ready():
            self._direct.write((frame,))  # nothing queued or in flight: order is kept
            WS_MESSAGES_SENT.inc()
            return
        self._out.append(frame)
        self._queued += len(frame)
        self._wakeup.set()

    def hold(self, nbytes: int) -> bool:
        """Count `nbytes` a subscription keeps for later against the buffer; False (closed with 4008) past it."""
        if self.close_code is not None:
            return False
        if not self._fits(nbytes):
            self._overflow()
            return False
        self._held += nbytes
        return True

    def release(self, nbytes: int) -> None:
        """Give back bytes from `hold` (delivered or dropped)."""
        self._held = max(0, self._held - nbytes)

    def _overflow(self) -> None:
        WS_SLOW_CLOSES.inc()
        log.warning("closing slow consumer", conn_id=self.conn_id, queued_bytes=self.queued_bytes)
        self.close(SLOW_CONSUMER, "slow consumer")

    def has_room(self, nbytes: int) -> bool:
        """True when `nbytes` more fit in half the buffer, or it is empty (replay waits on this)."""
        return self._queued == 0 or self._queued + self._held + nbytes <= self._limit // 2

    async def wait_room(self, nbytes: int) -> None:
        """Wait until the writer has drained enough for `nbytes` more (returns at once once closed)."""
        while not self.has_room(nbytes) and self.close_code is None:
            self._drained = anyio.Event()
            await self._drained.wait()

    def on_close(self, cleanup: Callable[[], None]) -> None:
        """Run `cleanup` when the connection ends (the subscriptions register one per connection)."""
        self._cleanups.append(cleanup)

    def close(self, code: int, reason: str = "") -> None:
        """Ask the writer to send a close frame after what is queued; safe to call twice."""
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
            if code == SLOW_CONSUMER:
                self._out.clear()
                self._queued = 0
            self._wakeup.set()
            self._drained.set()

    def gone(self, code: int) -> None:
        """The client is gone: nothing more will be sent; wake the writer and every replay waiting for room."""
        if self.close_code is None:
            self.close_code = code
        self._out.clear()
        self._queued = 0
        self._wakeup.set()
        self._drained.set()

    async def writer(self) -> None:
        """Send queued frames in order, then the close frame; a client that left ends it quietly."""
        try:
            await self._write()
        except OSError as exc:  # uvicorn's ClientDisconnected: leaving before a reply is normal
            log.debug("client left before its frames were sent", error=type(exc).__name__)
            self.gone(self.close_code or 1006)

    async def _write(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
            while self._out:
                await self._send_some()
                self._drained.set()
            if self.close_code is not None:
                with anyio.move_on_after(CLOSE_TIMEOUT):
                    await self._send({"type": "websocket.close", "code": self.close_code, "reason": self.close_reason})
                return

    async def _send_some(self) -> None:
        """A batch straight to the transport when it takes data, else one frame through ASGI `send`."""
        if self._direct is not None and self._direct.ready():
            batch, size = take_batch(self._out)
            self._queued -= size
            self._direct.write(batch)
            WS_MESSAGES_SENT.inc(len(batch))
            return
        frame = self._out.popleft()
        self._queued -= len(frame)
        self._sending = True  # popped but not yet written: notify must queue behind it
        try:
            await self._send({"type": "websocket.send", "text": frame})
        finally:
            self._sending = False
        WS_MESSAGES_SENT.inc()

    def run_cleanups(self) -> None:
        """Detach from every subscription; safe to call twice."""
        cleanups, self._cleanups = self._cleanups, []
        for cleanup in cleanups:
            cleanup()


class Gateway:
    """ASGI app of `/ws`: handshake auth, then one reader and one writer per connection."""

    def __init__(self, registry: Registry, secret: str, send_buffer_bytes: int, rate_limit: float = 0.0,
                 max_connections: int = 10_000) -> None:
        self.registry = registry
        self.rate_limit = rate_limit
        self.secret = secret
        self.send_buffer_bytes = send_buffer_bytes
        self.max_connections = max_connections
        self.connections: set[Connection] = set()
        self.accepting = True
        self.closed_all = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        if len(self.connections) >= self.max_connections:
            WS_REFUSED.labels("max_connections").inc()
            await deny(send, 503, f"too many connections (MEMENTO_MAX_CONNECTIONS={self.max_connections})")
            return
        try:
            identity = verify_token(self.secret, handshake_token(scope))
        except AuthError as exc:
            await deny(send, 401, str(exc))
            return
        if not self.accepting:
            await deny(send, 503, "shutting down")
            return
        await self._serve(Connection(send, identity, self.send_buffer_bytes), receive, send)

    async def _serve(self, conn: Connection, receive: Receive, send: Send) -> None:
        self.connections.add(conn)  # before the accept's await: the cap counts this connection at once
        WS_CONNECTIONS.inc()
        try:
            await send({"type": "websocket.accept"})
            with structlog.contextvars.bound_contextvars(conn_id=conn.conn_id, agent_id=conn.identity.agent_id):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._read, conn, receive, tg.cancel_scope)
                    tg.start_soon(expire, conn)
                    await conn.writer()
                    tg.cancel_scope.cancel()
        finally:
            conn.gone(conn.close_code or 1006)
            conn.run_cleanups()
            self.connections.discard(conn)
            WS_CONNECTIONS.dec()
            if not self.accepting and not self.connections:
                self.closed_all.set()

    async def _read(self, conn: Connection, receive: Receive, scope: anyio.CancelScope) -> None:
        call = Call(conn.identity, conn)
        bucket = TokenBucket(self.rate_limit, self.rate_limit) if self.rate_limit > 0 else None
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                conn.gone(message.get("code", 1000))
                scope.cancel()
                return
            frame = message.get("text") or message.get("bytes") or b""
            reply = await handle_frame(self.registry, call, frame, bucket)
            if reply is not None:
                conn.notify(reply.decode())

    def shutdown(self) -> None:
        """Stop accepting and close every connection with 1001 (going away)."""
        self.accepting = False
        if not self.connections:
            self.closed_all.set()
        for conn in list(self.connections):
            conn.close(GOING_AWAY)


async def expire(conn: Connection) -> None:
    """Close the connection with 4001 when its token expires: a token is good until `exp`, not beyond."""
    expires_at = conn.identity.expires_at
    if expires_at is None:
        return
    await anyio.sleep(max(0.0, expires_at - time.time()))
    WS_REFUSED.labels("token_expired").inc()
    log.info("token expired; closing", conn_id=conn.conn_id)
    conn.close(TOKEN_EXPIRED, "token expired")


def handshake_token(scope: Scope) -> str | None:
    """The bearer token of the Authorization header, else the `?token=` query parameter."""
    headers: dict[bytes, bytes] = dict(scope.get("headers", []))
    token = bearer(headers.get(b"authorization", b"").decode("latin-1"))
    if token:
        return token
    query: dict[str, list[str]] = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("token")
    return values[0] if values else None


async def deny(send: Send, status: int, reason: str) -> None:
    """Refuse the handshake with an HTTP status (ASGI websocket denial response)."""
    body: Any = json.dumps({"error": reason}).encode()
    await send({"type": "websocket.http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
    await send({"type": "websocket.http.response.body", "body": body})
