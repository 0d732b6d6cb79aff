"""JSON-RPC methods of event sourcing over a live session: session.diff, .snapshot and .compact (declared in
api/table_lifecycle.py beside the lifecycle's)."""

from __future__ import annotations

from pydantic import Field

from memento_sessions.history.views import History
from memento_sessions.rpc import Call, Result
from memento_sessions.sessions.methods import SessionParams
from memento_sessions.sessions.models import Seq


class DiffParams(SessionParams):
    fromSeq: Seq
    toSeq: Seq


class CompactParams(SessionParams):
    beforeSeq: Seq | None = Field(default=None, ge=1)


class HistoryMethods:
    """The three methods, over the daemon's one `History` (the lifecycle's: a stored session's reads fold
    through it too)."""

    def __init__(self, history: History) -> None:
        self.history = history

    async def diff(self, call: Call, p: DiffParams) -> Result:
        return await self.history.diff(call.identity.namespace, p.sessionId, p.fromSeq, p.toSeq)

    async def snapshot(self, call: Call, p: SessionParams) -> Result:
        return await self.history.snapshot(call.identity.namespace, p.sessionId)

    async def compact(self, call: Call, p: CompactParams) -> Result:
        return await self.history.compact(call.identity.namespace, p.sessionId, p.beforeSeq)
