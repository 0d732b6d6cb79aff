"""The exception hierarchy; every error a client can see carries its JSON-RPC code.

MementoError
 +-- ConfigError            bad configuration at start-up
 +-- BackendUnavailable     Redis, FalkorDB or Postgres did not answer (-32050)
 +-- RpcError               an error returned to a client as a JSON-RPC error
      +-- ParseError        -32700
      +-- InvalidRequest    -32600
      +-- MethodNotFound    -32601
      +-- InvalidParams     -32602 (data lists each field error)
      +-- Forbidden         -32001
      +-- NotFound          -32004
      +-- Conflict          -32009
      +-- RateLimited       -32029
"""

from __future__ import annotations

from typing import Any


class MementoError(Exception):
    """Root of every error raised by memento-sessions."""


class ConfigError(MementoError):
    """The configuration cannot be used; the message names the variable."""


class RpcError(MementoError):
    """An error a JSON-RPC client receives as `{"code", "message", "data"}`."""

    code = -32603

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        """The JSON-RPC error object."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ParseError(RpcError):
    code = -32700


class InvalidRequest(RpcError):
    code = -32600


class MethodNotFound(RpcError):
    code = -32601


class InvalidParams(RpcError):
    code = -32602


class Forbidden(RpcError):
    code = -32001


class NotFound(RpcError):
    code = -32004


class Conflict(RpcError):
    code = -32009


class RateLimited(RpcError):
    code = -32029


class BackendUnavailable(RpcError):
    code = -32050
