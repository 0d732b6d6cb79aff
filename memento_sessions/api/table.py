"""The table: every JSON-RPC method of the daemon, declared once, in the order the README lists them."""

from __future__ import annotations

from memento_sessions.api.spec import Declared, Parts, StepOf, Tool
from memento_sessions.api.steps import activity
from memento_sessions.api.table_coordination import COORDINATION
from memento_sessions.api.table_graph import GRAPH
from memento_sessions.api.table_lifecycle import LIFECYCLE
from memento_sessions.api.table_sessions import SESSIONS
from memento_sessions.rpc import Handler

METHODS: tuple[Declared, ...] = (*SESSIONS, *LIFECYCLE, *GRAPH, *COORDINATION)
AROUND_EVERY_METHOD: tuple[StepOf, ...] = (activity,)  # outermost, before each method's own steps


def stack(declared: Declared, parts: Parts) -> Handler:
    """The method's handler inside its steps, built once at start: the first step listed runs first (outermost),
    as a middleware stack does; nothing replaces the result afterwards."""
    handler = declared.handler(parts)
    for step in reversed((*AROUND_EVERY_METHOD, *declared.steps)):
        handler = step(parts, handler)
    return handler


def tools() -> list[tuple[Declared, Tool]]:
    """Every MCP tool with the method it calls, in the order clients list them."""
    pairs = [(declared, tool) for declared in METHODS for tool in declared.tools]
    return sorted(pairs, key=lambda pair: pair[1].listed)
