"""The `/ws` endpoint: authenticate the handshake, then serve JSON-RPC over one WebSocket.

Each connection has a reader (requests, answered in the order sent, dispatched through rpc.py) and a
writer fed by a bounded buffer (ws/connection.py). Fan-out only ever appends to that buffer; a client
whose buffer overflows is closed with 4008 instead of slowing the publisher (see docs/flow-control.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import parse_qs

import anyio
import structlog
from starlette.types import Receive, Scope, Send

from memento_sessions.auth import SESSION_ID, AuthError, Identity, bearer, session_agent, verify_token
from memento_sessions.limits import FOREGROUND, TokenBucket
from memento_sessions.logs import get_logger
from memento_sessions.metrics import WS_CONNECTIONS, WS_REFUSED
from memento_sessions.rpc import LARGE_FRAME, Call, Registry, Request, answer, let_go_of, prepare_in_parts
from memento_sessions.ws.connection import Connection

log = get_logger(__name__)
TOKEN_EXPIRED = 4001
GOING_AWAY = 1001
LOOK_AHEAD_BYTES = 64 * 1024  # behind a request frame this large, the next one is prepared while it runs


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
            identity = for_session(verify_token(self.secret, handshake_token(scope)), scope)
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
        timer: asyncio.TimerHandle | None = None
        try:
            await self.registry.connected(Call(conn.identity, conn))
            await send({"type": "websocket.accept"})
            timer = expiry_timer(conn)
            # Bound, never reset: this task (uvicorn's, one per connection) ends with the connection.
            structlog.contextvars.bind_contextvars(conn_id=conn.conn_id, agent_id=conn.identity.agent_id)
            await self._read_and_write(conn, receive)
        finally:
            if timer is not None:
                timer.cancel()
            conn.gone(conn.close_code or 1006)
            conn.run_cleanups()
            self.connections.discard(conn)
            WS_CONNECTIONS.dec()
            if not self.accepting and not self.connections:
                self.closed_all.set()

    async def _read_and_write(self, conn: Connection, receive: Receive) -> None:
        """The reader in a task of its own, the writer in this one: whichever ends first ends the other.

        A bare asyncio task, awaited here, rather than an anyio task group: the group's task handle (with its
        Event and wrapper coroutine) and the second task cost about 3 KB per connection, a tenth of an idle
        connection's memory.
        """
        with anyio.CancelScope() as writing:
            reader = asyncio.create_task(self._read(conn, receive, writing))
            try:
                await conn.writer()
            finally:
                reader.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.wait([reader])
        if not reader.cancelled() and (error := reader.exception()) is not None:
            raise error

    async def _read(self, conn: Connection, receive: Receive, writing: anyio.CancelScope) -> None:
        """Requests in, answered in order; when the client leaves (or this fails), the writer is cancelled.

        Behind a large request (a batch of events), the next frame is read and prepared (parsed, its params
        validated: CPU only) in a task of its own while this request awaits its backend, so this process's
        CPU and Redis's overlap for a client that pipelines batches; the requests still run one after the
        other. Small requests are read one after the other as ever: a task each would cost them more than
        their preparing takes. While a small request is answered, it counts as in flight (limits.Foreground):
        large work, this connection's or another's, waits for it between two of its parts.
        """
        call = Call(conn.identity, conn)
        bucket = TokenBucket(self.rate_limit, self.rate_limit) if self.rate_limit > 0 else None
        ahead: asyncio.Task[tuple[Request, int] | int] | None = None
        try:
            while True:
                given = await (ahead or self._next(receive, call, bucket))
                ahead = None
                if isinstance(given, int):
                    conn.gone(given)
                    return
                request, size = given
                if size >= LOOK_AHEAD_BYTES:
                    ahead = asyncio.create_task(self._next(receive, call, bucket))
                with FOREGROUND.serving(size < LARGE_FRAME):
                    reply = await answer(self.registry, call, request)
                if reply is not None:
                    conn.notify(reply.decode())
                conn.replied()
                if size >= LARGE_FRAME:
                    await let_go_of(request)  # its tens of thousands of ids freed a part at a time
        finally:
            if ahead is not None:
                ahead.cancel()
                ahead.add_done_callback(_retrieved)
            writing.cancel()

    async def _next(self, receive: Receive, call: Call, bucket: TokenBucket | None) -> tuple[Request, int] | int:
        """The next request, prepared, and its frame's size; the close code when the client left."""
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return int(message.get("code", 1000))
        frame = message.get("text") or message.get("bytes") or b""
        return await prepare_in_parts(self.registry, call, frame, bucket), len(frame)

    def shutdown(self) -> None:
        """Stop accepting and close every connection with 1001 (going away)."""
        self.accepting = False
        if not self.connections:
            self.closed_all.set()
        for conn in list(self.connections):
            conn.close(GOING_AWAY)


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A look-ahead task dropped with its connection: its outcome read, so asyncio never reports it unretrieved."""
    if not task.cancelled():
        task.exception()


def expiry_timer(conn: Connection) -> asyncio.TimerHandle | None:
    """Close the connection with 4001 when its token expires: a token is good until `exp`, not beyond.

    A loop timer rather than a task sleeping until then: 10,000 idle connections each kept one more task
    (its coroutine frame and anyio's wrapping) for the sake of a single call.
    """
    expires_at = conn.identity.expires_at
    if expires_at is None:
        return None
    return asyncio.get_running_loop().call_later(max(0.0, expires_at - time.time()), expire, conn)


def expire(conn: Connection) -> None:
    """The token expired: the writer sends 4001 after what is queued."""
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


def for_session(identity: Identity, scope: Scope) -> Identity:
    """With `?session=<Claude Code session id>`, that session's own agent of the token (session_agent: a token
    acts only as itself or its own sub-agents); else the token's agent."""
    query: dict[str, list[str]] = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("session")
    return session_agent(identity, values[0]) if values and SESSION_ID.match(values[0]) else identity


async def deny(send: Send, status: int, reason: str) -> None:
    """Refuse the handshake with an HTTP status (ASGI websocket denial response)."""
    body: Any = json.dumps({"error": reason}).encode()
    await send({"type": "websocket.http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
    await send({"type": "websocket.http.response.body", "body": body})
