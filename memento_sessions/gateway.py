"""The `/ws` endpoint: authenticate the handshake, then serve JSON-RPC over one WebSocket.

Each connection has a reader (requests, answered in the order sent) and a writer fed by a
bounded buffer. Fan-out only ever appends to that buffer; a client whose buffer overflows is
closed with 4008 instead of slowing the publisher (see docs/flow-control.md).
"""

from __future__ import annotations

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
from memento_sessions.metrics import WS_CONNECTIONS, WS_MESSAGES_SENT, WS_SLOW_CLOSES
from memento_sessions.ratelimit import TokenBucket
from memento_sessions.rpc import Call, Registry, handle_frame
from memento_sessions.wsframes import DirectWriter, take_batch

log = get_logger(__name__)
SLOW_CONSUMER = 4008
GOING_AWAY = 1001
CLOSE_TIMEOUT = 5.0


class Connection:
    """One authenticated client; `notify` never blocks, the writer drains the buffer."""

    def __init__(self, send: Send, identity: Identity, limit_bytes: int) -> None:
        self.conn_id = uuid.uuid4().hex[:12]
        self.identity = identity
        self._send = send
        self._direct = DirectWriter.behind(send)
        self._sending = False
        self._limit = limit_bytes
        self._out: deque[str] = deque()
        self._queued = 0
        self._wakeup = anyio.Event()
        self._drained = anyio.Event()
        self._cleanups: list[Callable[[], None]] = []
        self.close_code: int | None = None

    @property
    def queued_bytes(self) -> int:
        return self._queued

    def notify(self, frame: str) -> None:
        """Queue a frame; a client whose buffer would overflow is closed as a slow consumer."""
        if self.close_code is not None:
            return
        if self._queued + len(frame) > self._limit:
            WS_SLOW_CLOSES.inc()
            log.warning("closing slow consumer", conn_id=self.conn_id, queued_bytes=self._queued)
            self.close(SLOW_CONSUMER)
            return
        if self._direct is not None and not self._out and not self._sending and self._direct.ready():
            self._direct.write((frame,))  # nothing queued or in flight: order is kept
            WS_MESSAGES_SENT.inc()
            return
        self._out.append(frame)
        self._queued += len(frame)
        self._wakeup.set()

    def has_room(self, nbytes: int) -> bool:
        """True when `nbytes` more fit in the buffer (replay waits on this instead of overflowing)."""
        return self._queued + nbytes <= self._limit // 2

    async def wait_room(self, nbytes: int) -> None:
        """Wait until the writer has drained enough for `nbytes` more."""
        while not self.has_room(nbytes) and self.close_code is None:
            self._drained = anyio.Event()
            await self._drained.wait()

    def on_close(self, cleanup: Callable[[], None]) -> None:
        """Run `cleanup` when the connection ends (subscriptions drop themselves here)."""
        self._cleanups.append(cleanup)

    def close(self, code: int) -> None:
        """Ask the writer to send a close frame after what is queued; safe to call twice."""
        if self.close_code is None:
            self.close_code = code
            if code == SLOW_CONSUMER:
                self._out.clear()
                self._queued = 0
            self._wakeup.set()
            self._drained.set()

    async def writer(self) -> None:
        """Send queued frames in order; then the close frame, when one was asked for."""
        while True:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
            while self._out:
                await self._send_some()
                self._drained.set()
            if self.close_code is not None:
                with anyio.move_on_after(CLOSE_TIMEOUT):
                    await self._send({"type": "websocket.close", "code": self.close_code})
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

    def __init__(self, registry: Registry, secret: str, send_buffer_bytes: int, rate_limit: float = 0.0) -> None:
        self.registry = registry
        self.rate_limit = rate_limit
        self.secret = secret
        self.send_buffer_bytes = send_buffer_bytes
        self.connections: set[Connection] = set()
        self.accepting = True
        self.closed_all = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            identity = verify_token(self.secret, handshake_token(scope))
        except AuthError as exc:
            await deny(send, 401, str(exc))
            return
        if not self.accepting:
            await deny(send, 503, "shutting down")
            return
        await send({"type": "websocket.accept"})
        await self._serve(Connection(send, identity, self.send_buffer_bytes), receive)

    async def _serve(self, conn: Connection, receive: Receive) -> None:
        self.connections.add(conn)
        WS_CONNECTIONS.inc()
        try:
            with structlog.contextvars.bound_contextvars(conn_id=conn.conn_id, agent_id=conn.identity.agent_id):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._read, conn, receive, tg.cancel_scope)
                    await conn.writer()
                    tg.cancel_scope.cancel()
        finally:
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
                conn.close_code = conn.close_code or message.get("code", 1000)
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
    body: Any = f'{{"error": "{reason}"}}'.encode()
    await send({"type": "websocket.http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
    await send({"type": "websocket.http.response.body", "body": body})
