"""Read-only queries on a namespace's own graph, its indexes (CodebaseEntity.id first) made sure of once
by kg.graph.Graphs, which never creates a graph for a read.

Replies are read in FalkorDB's compact form by `scalar` below rather than by the falkordb client's
parser, which awaits a coroutine per value: a transitions reply holds ~1,400 values, and that parser
took ~2 ms of it. The bridge's queries return only scalars, lists and maps (bridge/queries.py).
"""

from __future__ import annotations

from typing import Any

from falkordb.helpers import stringify_param_value
from redis.exceptions import ResponseError

from memento_sessions.backends import Backends, translated
from memento_sessions.kg.graph import Graphs

Row = list[Any]


class NamespaceGraphs:
    """Runs a query on `Backends.graph_name(ns)` only: a namespace never reads another's graph.

    In the daemon `graphs` is its one Graphs (server/services.py), so the checkpointer and the bridge
    index a graph once between them; a caller of its own (a test) may leave it out.
    """

    def __init__(self, backends: Backends, graphs: Graphs | None = None) -> None:
        self.backends = backends
        self.graphs = graphs or Graphs(backends)

    async def rows(self, namespace: str, query: str, params: dict[str, Any]) -> list[Row]:
        """The rows of a read-only query; none when the namespace has no graph yet."""
        graph = await self.graphs.existing(namespace)
        if graph is None:
            return []
        header = "CYPHER " + " ".join(f"{key}={stringify_param_value(value)}" for key, value in params.items())
        try:
            with translated("falkordb"):
                reply = await self.backends.falkordb.connection.execute_command(
                    "GRAPH.RO_QUERY", graph.name, f"{header} {query}", "--compact")
        except ResponseError as exc:
            if "empty key" not in str(exc):
                raise
            self.graphs.forget(namespace)  # the graph was deleted since we indexed it
            return []
        if len(reply) < 3:  # a reply without columns is its statistics alone
            return []
        return [[scalar(cell) for cell in row] for row in reply[1]]


def scalar(cell: list[Any]) -> Any:
    """One compact `[type, value]` cell as Python: null, string, integer, boolean, double, array or map."""
    kind, value = cell
    if kind == _STRING:
        return value
    if kind == _ARRAY:
        return [scalar(item) for item in value]
    if kind in _PLAIN:
        return _PLAIN[kind](value)
    if kind == _MAP:
        return {value[i]: scalar(value[i + 1]) for i in range(0, len(value), 2)}
    raise ValueError(f"a bridge query returned a graph value of compact type {kind}; only scalars, lists "
                     "and maps are read")


_STRING, _ARRAY, _MAP = 2, 6, 10
_PLAIN: dict[int, Any] = {1: lambda _: None, 3: int, 4: lambda v: v == "true", 5: float}
