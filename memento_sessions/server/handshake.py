"""A deadline on the HTTP handshake: a client that sends its request headers too slowly is dropped.

uvicorn's h11 protocol waits for a request's headers as long as the socket stays open (its keep-alive
timeout runs only between requests and stops at the first byte), so one client dribbling a header a
minute holds a socket, and its memory, forever. This protocol arms a timer when the connection is made
and after each response, disarms it when a request's headers (a WebSocket upgrade's included) are in,
and closes the transport when it fires first. Use it with `uvicorn.Config(http=handshake_protocol(s))`.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

from memento_sessions.logs import get_logger
from memento_sessions.metrics import WS_REFUSED

log = get_logger(__name__)


class HandshakeDeadline(H11Protocol):
    """uvicorn's h11 protocol with a deadline of `timeout` seconds on each request's headers."""

    timeout = 10.0
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        scope = self.scope
        super().handle_events()
        if self.scope is not scope:  # a request's headers are in: the app has it now
            self._disarm()

    def on_response_complete(self) -> None:
        # Armed before uvicorn parses a pipelined request, which then disarms it.
        self._arm()
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return
        WS_REFUSED.labels("handshake_timeout").inc()
        log.info("handshake too slow; dropping the connection", timeout=self.timeout)
        self.transport.close()


def handshake_protocol(timeout: float) -> type[HandshakeDeadline]:
    """The protocol class for uvicorn's `http=` with a deadline of `timeout` seconds (MEMENTO_HANDSHAKE_TIMEOUT)."""
    return type("HandshakeDeadline", (HandshakeDeadline,), {"timeout": timeout})
