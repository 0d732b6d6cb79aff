"""JSON-RPC methods of the checkpointer and the KG: session.checkpoint and kg.upsert."""

from __future__ import annotations

from memento_sessions.checkpoints.checkpointer import Checkpointer
from memento_sessions.kg.loader import UpsertParams, upsert
from memento_sessions.rpc import Call, Registry, Result
from memento_sessions.sessions.methods import SessionParams


class CheckpointParams(SessionParams):
    final: bool = False


def register(registry: Registry, checkpointer: Checkpointer) -> None:
    """Add session.checkpoint and kg.upsert to the registry."""

    async def checkpoint(call: Call, p: CheckpointParams) -> Result:
        return await checkpointer.checkpoint(call.identity.namespace, p.sessionId, p.final)

    async def kg_upsert(call: Call, p: UpsertParams) -> Result:
        graph = await checkpointer.graphs.get(call.identity.namespace)
        nodes, edges = await upsert(graph, p.nodes, p.edges)
        return {"nodes": nodes, "edges": edges}

    registry.add("session.checkpoint", CheckpointParams, checkpoint, "sessions:write")
    registry.add("kg.upsert", UpsertParams, kg_upsert, "kg:write")
