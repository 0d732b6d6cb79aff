"""The exception hierarchy, every class of it here; every error a client can see carries its JSON-RPC code.

MementoError
 +-- ConfigError               bad configuration at start-up
 +-- AuthError                 a token missing, expired, forged or malformed (the handshake is refused)
 +-- DataDirLocked             another daemon already uses the data directory
 +-- EmbeddedStartError        an embedded server did not come up (the message points at its log)
 +-- BadRecord                 a record of a KG file is not valid (the message names its line and field)
 +-- RpcError                  an error returned to a client as a JSON-RPC error (-32603 when not one below)
      +-- ParseError           -32700
      +-- InvalidRequest       -32600
      +-- MethodNotFound       -32601
      +-- InvalidParams        -32602 (data lists each field error)
      +-- Forbidden            -32001
      +-- NotFound             -32004
      +-- Conflict             -32009
      +-- RateLimited          -32029
      +-- BackendUnavailable   -32050: Redis, FalkorDB or Postgres did not answer

Driver errors become BackendUnavailable in one place, memento_sessions.backends (`translated`, UNAVAILABLE;
a Redis Cluster of which no node answers is one of them, ClusterUnreachable there).
The client's own errors (a lost connection, a request timeout ...) are in memento_sessions.client.errors.
`Reason` lists every `data.reason` a client may branch on.

MAX_FRAME is the wire's one fixed limit, shared by the daemon (which enforces it: a larger message closes
the connection) and the client (which checks a request against it before sending, so that it gets an
error rather than a closed connection).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

MAX_FRAME = 1024 * 1024  # bytes of a WebSocket message to the daemon; a larger one closes the connection (1009)


class Reason(StrEnum):
    """Every `data.reason` an error may carry: what a client branches on, beside the code. The Lua libraries
    write some of them in their `FULL <reason>` replies (tests/test_reasons.py keeps the two lists equal)."""

    SESSION_FULL = "session_full"  # -32009: the session holds MEMENTO_SESSION_MAX_EVENTS events
    NAMESPACE_FULL = "namespace_full"  # -32009: the namespace holds MEMENTO_NAMESPACE_MAX_SESSIONS live sessions
    STALE_LEASE = "stale_lease"  # -32009: an event's fencingToken is older than a newer grant on its entities
    LEASE_LIMIT = "lease_limit"  # -32009: the namespace holds MEMENTO_LEASE_MAX live leases
    ENTITY_HOLDS = "entity_holds"  # -32009: an entity already has MEMENTO_LEASE_MAX_HOLDS live holds
    LEASE_TOO_LARGE = "lease_too_large"  # -32009: the entities and what they contain pass MEMENTO_LEASE_MAX_COVERED
    MAILBOX_LIMIT = "mailbox_limit"  # -32009: the namespace holds MEMENTO_MAILBOXES_MAX mailboxes
    ID_TAKEN = "id_taken"  # -32009: a message id already used for another message
    COMPACTED = "compacted"  # -32009: the events asked for were compacted away (data.compactedSeq)
    BUSY = "busy"  # -32009 or -32029: another write or too many heavy requests; try again
    ACTIVE = "active"  # -32009: the session is live in Redis, not suspended
    SUSPENDED = "suspended"  # -32009: the session is suspended (resume it first)
    COMPLETED = "completed"  # -32009: the session is completed
    ARCHIVED = "archived"  # -32009: the session is archived, its events gone
    FORK_DEPTH = "fork_depth"  # -32009: a fork of a fork past MEMENTO_FORK_MAX_DEPTH
    TOO_MANY_SUBSCRIPTIONS = "too_many_subscriptions"  # -32009: the connection's subscription limit
    TOO_MANY_MCP_SESSIONS = "too_many_mcp_sessions"  # -32029: the identity's MCP session quota
    OUT_OF_MEMORY = "outOfMemory"  # -32050: Redis at its maxmemory refuses writes
    REPLICA_ACK_TIMEOUT = "replica_ack_timeout"  # -32050: too few replicas acknowledged the write in time


class MementoError(Exception):
    """Root of every error raised by memento-sessions."""


class ConfigError(MementoError):
    """The configuration cannot be used; the message names the variable."""


class AuthError(MementoError):
    """The token is missing, expired, forged or malformed."""


class DataDirLocked(MementoError):
    """Another daemon already uses this data directory."""


class EmbeddedStartError(MementoError):
    """An embedded server did not come up; the message points at its log."""


class BadRecord(MementoError):
    """A record of a KG file is not valid; the message names its line and field."""

    def __init__(self, line: int, field: str, message: str) -> None:
        super().__init__(f"line {line}: {field}: {message}")
        self.line = line
        self.field = field


class RpcError(MementoError):
    """An error a JSON-RPC client receives as `{"code", "message", "data"}`.

    Each subclass names its code in its class statement (`class NotFound(RpcError, code=-32004)`).
    """

    code = -32603

    def __init_subclass__(cls, code: int, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.code = code

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


class ParseError(RpcError, code=-32700):
    """The frame is not valid JSON."""


class InvalidRequest(RpcError, code=-32600):
    """The frame is JSON but not a JSON-RPC 2.0 request (batches are not supported)."""


class MethodNotFound(RpcError, code=-32601):
    """No method (or MCP tool) of that name."""


class InvalidParams(RpcError, code=-32602):
    """The params do not fit the method; data lists each field error."""


class Forbidden(RpcError, code=-32001):
    """The token lacks the method's scope, or the caller acts as someone it is not."""


class NotFound(RpcError, code=-32004):
    """What the request names does not exist in the caller's namespace (or has expired)."""


class Conflict(RpcError, code=-32009):
    """The request is valid but the state refuses it (a bound reached, events compacted ...); data.reason says which."""


class RateLimited(RpcError, code=-32029):
    """The caller is over its rate; nothing ran, and data.retryAfterMs says when to try again."""


class BackendUnavailable(RpcError, code=-32050):
    """Redis, FalkorDB or Postgres did not answer; the message names which."""
