"""The registry built from the table, once at start: every declared method with its steps composed."""

from __future__ import annotations

from memento_sessions.api.spec import Parts
from memento_sessions.api.table import METHODS, stack
from memento_sessions.rpc import Call, Registry


def registry(parts: Parts) -> Registry:
    """Every declared method registered once (a name declared twice fails here, at start), and the hooks
    a new connection runs before it is accepted: its presence and its mailbox pushes (coordination)."""
    async def remember(call: Call) -> None:
        await parts.coord.mailbox.remember(call.identity)  # a send may reach it now

    built = Registry(on_connect=(parts.coord.connect, remember))
    for declared in METHODS:
        built.add(declared.name, declared.params, stack(declared, parts), declared.scope)
    return built
