"""JSON-RPC method of the checkpointer: session.checkpoint."""

from __future__ import annotations

from memento_sessions.checkpoints.checkpointer import Checkpointer
from memento_sessions.rpc import Call, Registry, Result
from memento_sessions.sessions.methods import SessionParams


class CheckpointParams(SessionParams):
    final: bool = False


def register(registry: Registry, checkpointer: Checkpointer) -> None:
    """Add session.checkpoint to the registry."""

    async def checkpoint(call: Call, p: CheckpointParams) -> Result:
        return await checkpointer.checkpoint(call.identity.namespace, p.sessionId, p.final)

    registry.add("session.checkpoint", CheckpointParams, checkpoint, "sessions:write")
