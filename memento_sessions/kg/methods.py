"""JSON-RPC method of the knowledge graph: kg.upsert (declared in api/)."""

from __future__ import annotations

from memento_sessions.kg.graph import Graphs
from memento_sessions.kg.loader import UpsertParams, upsert
from memento_sessions.rpc import Call, Result


class GraphMethods:
    """`kg.upsert` over the daemon's one Graphs."""

    def __init__(self, graphs: Graphs) -> None:
        self.graphs = graphs

    async def upsert(self, call: Call, p: UpsertParams) -> Result:
        graph = await self.graphs.get(call.identity.namespace)
        nodes, edges = await upsert(graph, p.nodes, p.edges)
        return {"nodes": nodes, "edges": edges}
