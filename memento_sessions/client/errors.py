"""The client's exceptions, and the server's JSON-RPC error codes mapped to their RpcError subclasses.

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

from collections.abc import Mapping
from typing import Any

from memento_sessions.errors import MementoError, RpcError

# Every error class of the protocol names its code in errors.py: a new one is known here without a list to keep.
_ERRORS: dict[int, type[RpcError]] = {cls.code: cls for cls in RpcError.__subclasses__()}


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


def rpc_error(error: Mapping[str, Any]) -> RpcError:
    """The RpcError subclass of a JSON-RPC error object (code kept as sent when unknown)."""
    code = int(error.get("code", -32603))
    exc = _ERRORS.get(code, RpcError)(str(error.get("message", "")), error.get("data"))
    exc.code = code
    return exc
