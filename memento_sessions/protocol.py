"""The wire protocol's one fixed limit, shared by the daemon (which enforces it) and the client (which
checks a request against it before sending, so that it gets an error rather than a closed connection)."""

from __future__ import annotations

MAX_FRAME = 1024 * 1024  # bytes of a WebSocket message to the daemon; a larger one closes the connection (1009)
