"""`Client`: the async Python client of the `/ws` JSON-RPC API.

One WebSocket per client. A reader task routes replies to the requests waiting for them (several may
be in flight) and notifications to subscriptions. When the connection drops, requests in flight fail
with ConnectionLost; reads, and emits whose events all carry an idempotency `id`, are sent again once
the client has reconnected (with jittered exponential backoff), and every subscription resumes after the
last seq it delivered, with the last epoch it saw. Design notes: docs/client.md.

core.py      Client: the connection, its reader, reconnect and restore, requests, subscription bookkeeping
methods.py   the typed methods of the API (create_session, emit, get, ...), which Client inherits
feeds.py     Subscription and Watch, the bounded notification queues a Client hands out, their states
             (Phase, Link), and Event
errors.py    the exceptions (hierarchy in its docstring); JSON-RPC error codes mapped to RpcError subclasses
backoff.py   the jittered exponential backoff between reconnects, and how often a call is retried
wire.py      request params, their JSON encoding, the 1 MiB frame limit, the bearer token source
conversation.py  LiveConversation: a session's conversation state folded live with the daemon's own reducer

A leaf: it may import only the shared ground (errors, logs) and ingest/ (the reducer), never the daemon's
packages.
"""

from memento_sessions.client.backoff import RETRIES, backoff_delay
from memento_sessions.client.conversation import LiveConversation, load_conversation
from memento_sessions.client.core import Client
from memento_sessions.client.errors import (
    ClientClosed,
    ConnectionLost,
    HistoryLost,
    RequestTimeout,
    RequestTooLarge,
    Unauthorized,
    rpc_error,
)
from memento_sessions.client.feeds import Event, Link, Phase, Subscription, Watch
from memento_sessions.client.wire import MAX_FRAME, Result, compact, encode, token_source
from memento_sessions.errors import MementoError, RpcError

__all__ = [
    "MAX_FRAME", "RETRIES", "Client", "ClientClosed", "ConnectionLost", "Event", "HistoryLost", "Link",
    "LiveConversation", "MementoError", "Phase", "RequestTimeout", "RequestTooLarge", "Result", "RpcError",
    "Subscription", "Unauthorized", "Watch", "backoff_delay", "compact", "encode", "load_conversation", "rpc_error",
    "token_source",
]
