"""JSON-RPC method of the knowledge graph: kg.upsert."""

from __future__ import annotations

from memento_sessions.kg.graph import Graphs
from memento_sessions.kg.loader import UpsertParams, upsert
from memento_sessions.rpc import Call, Registry, Result


def register(registry: Registry, graphs: Graphs) -> None:
    """Add kg.upsert to the registry."""

    async def kg_upsert(call: Call, p: UpsertParams) -> Result:
        graph = await graphs.get(call.identity.namespace)
        nodes, edges = await upsert(graph, p.nodes, p.edges)
        return {"nodes": nodes, "edges": edges}

    registry.add("kg.upsert", UpsertParams, kg_upsert, "kg:write")
