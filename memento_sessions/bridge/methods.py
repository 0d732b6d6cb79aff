"""JSON-RPC methods over the SessionBridge: bridge.transitions, .isolate, .handoff and .outcomes."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from memento_sessions.bridge.bridge import SessionBridge
from memento_sessions.rpc import Call, Registry, Result
from memento_sessions.sessions.methods import Params, SessionParams
from memento_sessions.sessions.models import ClientId, EntityId, Seq


class TransitionsParams(SessionParams):
    entityId: EntityId | None = None


class IsolateParams(SessionParams):
    agentId: ClientId
    since: Seq = 0  # a previous page's nextSince
    limit: int | None = Field(default=None, ge=1, le=10_000)


class HandoffParams(SessionParams):
    head: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")] | None = None  # the receiver's
    dirtyDigest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None

    @model_validator(mode="after")
    def _digest_needs_head(self) -> HandoffParams:
        if self.dirtyDigest is not None and self.head is None:
            raise ValueError("dirtyDigest is compared only with a head: give head too")
        return self


class OutcomesParams(Params):
    clusterId: EntityId
    days: int = Field(default=7, ge=1, le=365)


def register(registry: Registry, bridge: SessionBridge) -> None:
    """Add the bridge methods to the registry; each reads only the caller's namespace."""

    async def transitions(call: Call, p: TransitionsParams) -> Result:
        return await bridge.transitions(call.identity.namespace, p.sessionId, p.entityId)

    async def isolate(call: Call, p: IsolateParams) -> Result:
        return await bridge.isolate(call.identity.namespace, p.sessionId, p.agentId, p.since, p.limit)

    async def handoff(call: Call, p: HandoffParams) -> Result:
        return await bridge.handoff(call.identity.namespace, p.sessionId, p.head, p.dirtyDigest)

    async def outcomes(call: Call, p: OutcomesParams) -> Result:
        return await bridge.outcomes(call.identity.namespace, p.clusterId, p.days)

    registry.add("bridge.transitions", TransitionsParams, transitions, "sessions:read")
    registry.add("bridge.isolate", IsolateParams, isolate, "sessions:read")
    registry.add("bridge.handoff", HandoffParams, handoff, "sessions:read")
    registry.add("bridge.outcomes", OutcomesParams, outcomes, "sessions:read")
