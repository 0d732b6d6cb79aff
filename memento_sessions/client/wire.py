"""What goes over the wire: request params, their JSON encoding, the frame limit and the bearer token."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from memento_sessions.errors import MAX_FRAME as MAX_FRAME  # the daemon's limit, checked before sending

Result = dict[str, Any]


def token_source(token: str | Callable[[], str]) -> Callable[[], str]:
    """A callable giving the token for each handshake (a callable lets a client refresh its token)."""
    if callable(token):
        return token
    return lambda: token


def compact(**params: Any) -> Result:
    """The params object without the arguments left at None."""
    return {name: value for name, value in params.items() if value is not None}


def encode(value: object) -> object:
    """JSON for what `json` cannot encode alone: any Mapping, and datetimes (ISO-8601)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot send a {type(value).__name__} as JSON")
