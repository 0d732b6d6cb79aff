"""The async Python client of the `/ws` JSON-RPC API: `from memento_sessions.client import Client`."""

from memento_sessions.client.core import (
    MAX_FRAME,
    RETRIES,
    Client,
    ClientClosed,
    ConnectionLost,
    Event,
    HistoryLost,
    RequestTimeout,
    RequestTooLarge,
    Result,
    Subscription,
    Unauthorized,
    Watch,
    backoff_delay,
    compact,
    encode,
    rpc_error,
    token_source,
)
from memento_sessions.errors import MementoError, RpcError

__all__ = [
    "MAX_FRAME", "RETRIES", "Client", "ClientClosed", "ConnectionLost", "Event", "HistoryLost", "MementoError",
    "RequestTimeout", "RequestTooLarge", "Result", "RpcError", "Subscription", "Unauthorized", "Watch",
    "backoff_delay", "compact", "encode", "rpc_error", "token_source",
]
