"""JSON-RPC methods over the SessionBridge: bridge.transitions, .isolate, .handoff and .outcomes."""

from __future__ import annotations

from pydantic import Field

from memento_sessions.bridge.bridge import SessionBridge
from memento_sessions.rpc import Call, Registry, Result
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


def register(registry: Registry, bridge: SessionBridge) -> None:
    """Add the bridge methods to the registry; each reads only the caller's namespace."""

    async def transitions(call: Call, p: TransitionsParams) -> Result:
        return await bridge.transitions(call.identity.namespace, p.sessionId, p.entityId)

    async def isolate(call: Call, p: IsolateParams) -> Result:
        result = await bridge.isolate(call.identity.namespace, p.sessionId, p.agentId, p.since, p.limit)
        return {**result, "usage": (await session_totals(bridge.manager.redis, call.identity.namespace,
                                                         p.sessionId))["totals"]}

    async def handoff(call: Call, p: SessionParams) -> Result:
        result = await bridge.handoff(call.identity.namespace, p.sessionId)
        return {**result, "usage": (await session_totals(bridge.manager.redis, call.identity.namespace,
                                                         p.sessionId))["totals"]}

    async def outcomes(call: Call, p: OutcomesParams) -> Result:
        return await bridge.outcomes(call.identity.namespace, p.clusterId, p.days)

    registry.add("bridge.transitions", TransitionsParams, transitions, "sessions:read")
    registry.add("bridge.isolate", IsolateParams, isolate, "sessions:read")
    registry.add("bridge.handoff", SessionParams, handoff, "sessions:read")
    registry.add("bridge.outcomes", OutcomesParams, outcomes, "sessions:read")
