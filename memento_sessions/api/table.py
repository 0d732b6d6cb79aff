"""The table: every JSON-RPC method of the daemon, declared once, in the order the README lists them."""

from __future__ import annotations

import functools

from memento_sessions.api.openrpc import document
from memento_sessions.api.spec import READ, Declared, Parts, StepOf, Tool
from memento_sessions.api.steps import activity
from memento_sessions.api.table_coordination import COORDINATION
from memento_sessions.api.table_graph import GRAPH
from memento_sessions.api.table_lifecycle import LIFECYCLE
from memento_sessions.api.table_sessions import SESSIONS
from memento_sessions.api.table_usage import USAGE
from memento_sessions.client.results import Discovered
from memento_sessions.rpc import Call, Handler, Result
from memento_sessions.sessions.methods import Params


async def discover(call: Call, params: Params) -> Result:
    """rpc.discover: the OpenRPC document of the whole table (built once, on the first call)."""
    return openrpc_document()


DISCOVER = Declared("rpc.discover", Params, Discovered, READ, lambda s: discover,
                    "The OpenRPC 1.3 document of every method: params, results, errors.")
METHODS: tuple[Declared, ...] = (*SESSIONS, *LIFECYCLE, *GRAPH, *COORDINATION, *USAGE, DISCOVER)
AROUND_EVERY_METHOD: tuple[StepOf, ...] = (activity,)  # outermost, before each method's own steps


def stack(declared: Declared, parts: Parts) -> Handler:
    """The method's handler inside its steps, built once at start: the first step listed runs first (outermost),
    as a middleware stack does; nothing replaces the result afterwards."""
    handler = declared.handler(parts)
    for step in reversed((*AROUND_EVERY_METHOD, *declared.steps)):
        handler = step(parts, handler)
    return handler


@functools.cache
def openrpc_document() -> Result:
    """The OpenRPC document of METHODS (docs/openrpc.json is this, published)."""
    return document(METHODS)


def tools() -> list[tuple[Declared, Tool]]:
    """Every MCP tool with the method it calls, in the order clients list them."""
    pairs = [(declared, tool) for declared in METHODS for tool in declared.tools]
    return sorted(pairs, key=lambda pair: pair[1].listed)
