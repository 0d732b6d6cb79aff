"""Read-only queries on a namespace's own graph, its indexes (CodebaseEntity.id first) made sure of once."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from memento_sessions.backends import Backends
from memento_sessions.kg.graph import ensure_indexes

Row = list[Any]


class NamespaceGraphs:
    """Runs a query on `Backends.graph_name(ns)` only: a namespace never reads another's graph."""

    def __init__(self, backends: Backends) -> None:
        self.backends = backends
        self._ready: dict[str, Any] = {}

    async def rows(self, namespace: str, query: str, params: dict[str, Any]) -> list[Row]:
        """The rows of a read-only query; none when the namespace has no graph yet."""
        name = self.backends.graph_name(namespace)
        graph = self._ready.get(name) or await self.prepare(name)
        if graph is None:
            return []
        try:
            result = await graph.ro_query(query, params)
        except ResponseError as exc:
            if "empty key" not in str(exc):
                raise
            self._ready.pop(name, None)  # the graph was deleted since we indexed it
            return []
        rows: list[Row] = result.result_set
        return rows

    async def prepare(self, name: str) -> Any:
        """Index an existing graph (idempotently) and keep its handle; None when the graph does not exist.

        A query must not create a graph as a side effect, so a missing graph is left missing.
        """
        if not await self.backends.falkordb.connection.exists(name):
            return None
        graph = self.backends.falkordb.select_graph(name)
        await ensure_indexes(graph)  # CodebaseEntity.id among them; "already indexed" is fine
        self._ready[name] = graph
        return graph
