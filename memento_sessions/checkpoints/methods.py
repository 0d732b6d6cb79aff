"""JSON-RPC method of the checkpointer: session.checkpoint (declared in api/)."""

from __future__ import annotations

from memento_sessions.checkpoints.checkpointer import Checkpointer
from memento_sessions.rpc import Call, Result
from memento_sessions.sessions.methods import SessionParams


class CheckpointParams(SessionParams):
    final: bool = False


class CheckpointMethods:
    """`session.checkpoint` over the daemon's one Checkpointer."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer

    async def checkpoint(self, call: Call, p: CheckpointParams) -> Result:
        return await self.checkpointer.checkpoint(call.identity.namespace, p.sessionId, p.final)
