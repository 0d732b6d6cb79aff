"""JSON-RPC methods over the SessionBridge: bridge.transitions, .isolate, .handoff and .outcomes (declared in api/)."""

from __future__ import annotations

from pydantic import Field

from memento_sessions.bridge.bridge import SessionBridge
from memento_sessions.rpc import Call, Result
from memento_sessions.sessions.methods import Params, SessionParams
from memento_sessions.sessions.models import ClientId, EntityId, Seq
from memento_sessions.usage.query import session_totals


class TransitionsParams(SessionParams):
    entityId: EntityId | None = None


class IsolateParams(SessionParams):
    agentId: ClientId
    since: Seq = 0  # a previous page's nextSince
    limit: int | None = Field(default=None, ge=1, le=10_000)


class OutcomesParams(Params):
    clusterId: EntityId
    days: int = Field(default=7, ge=1, le=365)


class BridgeMethods:
    """The bridge methods; each reads only the caller's namespace."""

    def __init__(self, bridge: SessionBridge) -> None:
        self.bridge = bridge

    async def transitions(self, call: Call, p: TransitionsParams) -> Result:
        return await self.bridge.transitions(call.identity.namespace, p.sessionId, p.entityId)

    async def isolate(self, call: Call, p: IsolateParams) -> Result:
        result = await self.bridge.isolate(call.identity.namespace, p.sessionId, p.agentId, p.since, p.limit)
        return {**result, "usage": await self.usage(call, p.sessionId)}

    async def handoff(self, call: Call, p: SessionParams) -> Result:
        result = await self.bridge.handoff(call.identity.namespace, p.sessionId)
        return {**result, "usage": await self.usage(call, p.sessionId)}

    async def outcomes(self, call: Call, p: OutcomesParams) -> Result:
        return await self.bridge.outcomes(call.identity.namespace, p.clusterId, p.days)

    async def usage(self, call: Call, session_id: str) -> Result:
        """The session's usage totals (usage.get), which isolate and handoff carry."""
        found = await session_totals(self.bridge.manager.redis, call.identity.namespace, session_id)
        totals: Result = found["totals"]
        return totals
