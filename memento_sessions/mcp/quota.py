"""At most MEMENTO_MCP_MAX_SESSIONS streamable-HTTP MCP sessions per agent: its oldest idle one makes room.

The SDK bounds sessions per daemon only (10,000 by default): one token opening sessions in a loop would
fill that for every tenant until they idle out. This ASGI middleware sits between the bearer check
(`streamable.BearerAuth`, which names the caller) and the SDK. It learns each agent's sessions from the
`mcp-session-id` the SDK answers an opening request with, and counts the requests in flight on each.
When an agent at its limit opens another session, the one it left idle the longest is closed first, by
a DELETE sent through the SDK exactly as a client would end it (its id then answers 404). When none is
idle (each has a request or an event stream open), the new one is refused with HTTP 503 and a JSON-RPC
error naming the limit. A session idle for the SDK's idle timeout has expired there and is forgotten here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memento_sessions.errors import Reason
from memento_sessions.logs import get_logger
from memento_sessions.metrics import MCP_SESSION_LIMIT

log = get_logger(__name__)
SESSION_HEADER = "mcp-session-id"
Owner = tuple[str, str]  # (namespace, agent id)


@dataclass
class Slot:
    """One open session: requests being served on it, and since when it has had none."""

    in_flight: int = 0
    idle_since: float = field(default_factory=time.monotonic)


class SessionQuota:
    """ASGI middleware: each owner keeps at most `per_agent` MCP sessions."""

    def __init__(self, app: ASGIApp, per_agent: int, idle_timeout: float) -> None:
        self.app = app
        self.per_agent = per_agent
        self.idle_timeout = idle_timeout
        self.sessions: dict[Owner, dict[str, Slot]] = {}
        self.opening: dict[Owner, int] = {}  # opening requests not answered yet: they count against the limit

    async def serve(self, owner: Owner, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request of `owner` (the identity the bearer token proved)."""
        session_id = Headers(scope=scope).get(SESSION_HEADER)
        if session_id is None:
            await self._open(owner, scope, receive, send)
        else:
            await self._use(owner, session_id, scope, receive, send)

    def live(self, owner: Owner) -> dict[str, Slot]:
        """The owner's sessions, without those the SDK has expired as idle."""
        mine = self.sessions.get(owner, {})
        cutoff = time.monotonic() - self.idle_timeout
        for session_id in [sid for sid, slot in mine.items() if not slot.in_flight and slot.idle_since < cutoff]:
            del mine[session_id]
        return mine

    async def _open(self, owner: Owner, scope: Scope, receive: Receive, send: Send) -> None:
        mine = self.live(owner)
        if len(mine) + self.opening.get(owner, 0) >= self.per_agent and not await self._make_room(owner, mine, scope):
            MCP_SESSION_LIMIT.labels("refused").inc()
            await self._refuse(owner)(scope, receive, send)
            return
        self.opening[owner] = self.opening.get(owner, 0) + 1
        try:
            status, session_id = await _answered(self.app, scope, receive, send)
        finally:
            self._opened(owner)
        if session_id is not None and status < 400:
            self.sessions.setdefault(owner, {})[session_id] = Slot()

    def _opened(self, owner: Owner) -> None:
        left = self.opening.pop(owner, 1) - 1
        if left:
            self.opening[owner] = left

    async def _make_room(self, owner: Owner, mine: dict[str, Slot], scope: Scope) -> bool:
        """Close the owner's session idle the longest; False when every one is in use."""
        idle = [(slot.idle_since, sid) for sid, slot in mine.items() if not slot.in_flight]
        if not idle:
            return False
        victim = min(idle)[1]
        del mine[victim]
        MCP_SESSION_LIMIT.labels("closed").inc()
        log.info("closed the oldest idle MCP session for a new one", namespace=owner[0], agent_id=owner[1])
        await _delete(self.app, scope, victim)
        return True

    def _refuse(self, owner: Owner) -> JSONResponse:
        message = (f"too many MCP sessions: agent {owner[1]!r} has {self.per_agent} open, each with a request in "
                   "flight (MEMENTO_MCP_MAX_SESSIONS); end one (HTTP DELETE) or wait for one to go idle")
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32009, "message": message,
                                                        "data": {"reason": Reason.TOO_MANY_MCP_SESSIONS,
                                                                 "limit": self.per_agent}}}
        return JSONResponse(body, status_code=503)

    async def _use(self, owner: Owner, session_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        slot = self.sessions.get(owner, {}).get(session_id)
        if slot is None:  # another owner's, unknown or expired: the SDK answers 404
            await self.app(scope, receive, send)
            return
        slot.in_flight += 1
        status = 500
        try:
            status, _ = await _answered(self.app, scope, receive, send)
        finally:
            slot.in_flight -= 1
            slot.idle_since = time.monotonic()
            if status == 404 or (scope["method"] == "DELETE" and status < 400):
                self._forget(owner, session_id)

    def _forget(self, owner: Owner, session_id: str) -> None:
        mine = self.sessions.get(owner, {})
        mine.pop(session_id, None)
        if not mine:
            self.sessions.pop(owner, None)


async def _answered(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> tuple[int, str | None]:
    """Run `app` for one request; the HTTP status it answered and the session id it named."""
    seen: dict[str, int | str | None] = {"status": 500, "session": None}

    async def watch(message: Message) -> None:
        if message["type"] == "http.response.start":
            seen["status"] = int(message["status"])
            seen["session"] = Headers(raw=message.get("headers", [])).get(SESSION_HEADER)
        await send(message)

    await app(scope, receive, watch)
    status, session = seen["status"], seen["session"]
    return int(status or 500), session if isinstance(session, str) else None


async def _delete(app: ASGIApp, scope: Scope, session_id: str) -> None:
    """End `session_id` as its client would: a DELETE with the opening request's host and credentials."""
    skip = {SESSION_HEADER.encode(), b"content-length", b"content-type", b"mcp-protocol-version"}
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in skip]
    request = {**scope, "method": "DELETE", "headers": [*headers, (SESSION_HEADER.encode(), session_id.encode())]}

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def discard(_: Message) -> None:
        return None

    await app(request, receive, discard)
