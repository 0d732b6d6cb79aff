"""Read-only queries on a namespace's own graph, its indexes (CodebaseEntity.id first) made sure of once
by kg.graph.Graphs, which never creates a graph for a read and reads the replies in compact form.
"""

from __future__ import annotations

from typing import Any

from memento_sessions.backends import Backends
from memento_sessions.kg.graph import Graphs, Row


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
        return await self.graphs.rows(namespace, query, params)
