"""JSON-RPC methods over the SessionBridge: bridge.transitions, .isolate, .handoff, .outcomes and .commit.

bridge.commit reads the commit index (commits.py), which the emit methods feed: they are wrapped here so
that each stored `commit` event is noted once its write succeeded."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints, model_validator

from memento_sessions.bridge.bridge import SessionBridge
from memento_sessions.bridge.commits import Commits, commit_sha
from memento_sessions.rpc import Call, Method, Registry, Result
from memento_sessions.sessions.methods import Params, SessionParams
from memento_sessions.sessions.models import ClientId, EntityId, Seq
from memento_sessions.usage.query import agent_share, session_totals


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


class CommitParams(Params):
    sha: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{7,64}$")]


class OutcomesParams(Params):
    clusterId: EntityId
    days: int = Field(default=7, ge=1, le=365)


def register(registry: Registry, bridge: SessionBridge) -> None:
    """Add the bridge methods to the registry; each reads only the caller's namespace."""

    async def transitions(call: Call, p: TransitionsParams) -> Result:
        return await bridge.transitions(call.identity.namespace, p.sessionId, p.entityId)

    async def isolate(call: Call, p: IsolateParams) -> Result:
        result = await bridge.isolate(call.identity.namespace, p.sessionId, p.agentId, p.since, p.limit)
        share = await agent_share(bridge.manager.redis, call.identity.namespace, p.sessionId, p.agentId,
                                  bridge.manager.settings.usage_agents_per_session)
        return {**result, "usage": share["totals"] if share is not None else None}

    async def handoff(call: Call, p: HandoffParams) -> Result:
        result = await bridge.handoff(call.identity.namespace, p.sessionId, p.head, p.dirtyDigest)
        return {**result, "usage": (await session_totals(bridge.manager.redis, call.identity.namespace,
                                                         p.sessionId))["totals"]}

    async def outcomes(call: Call, p: OutcomesParams) -> Result:
        return await bridge.outcomes(call.identity.namespace, p.clusterId, p.days)

    registry.add("bridge.transitions", TransitionsParams, transitions, "sessions:read")
    registry.add("bridge.isolate", IsolateParams, isolate, "sessions:read")
    registry.add("bridge.handoff", HandoffParams, handoff, "sessions:read")
    registry.add("bridge.outcomes", OutcomesParams, outcomes, "sessions:read")
    commits = Commits(bridge.manager.redis, bridge.manager.settings.commits_max)

    async def commit(call: Call, p: CommitParams) -> Result:
        return await commits.find(call.identity.namespace, p.sha)

    registry.add("bridge.commit", CommitParams, commit, "sessions:read")
    note_commits(registry, commits)


def note_commits(registry: Registry, commits: Commits) -> None:
    """Wrap event.emit and event.emitBatch: each `commit` event they store is noted in the commit index."""
    emit, batch = registry.methods.get("event.emit"), registry.methods.get("event.emitBatch")

    async def emitted(call: Call, p: Any) -> Result:
        assert emit is not None
        result = await emit.handler(call, p)
        if (sha := commit_sha(p.event)) and not result.get("duplicate"):
            await commits.note(call.identity.namespace, p.sessionId, result["seq"], sha, call.identity.agent_id)
        return result

    async def batched(call: Call, p: Any) -> Result:
        assert batch is not None
        result = await batch.handler(call, p)
        duplicates = set(result.get("duplicates", ()))
        for seq, event in zip(result["seqs"], p.events, strict=True):
            if (sha := commit_sha(event)) and seq not in duplicates:
                await commits.note(call.identity.namespace, p.sessionId, seq, sha, call.identity.agent_id)
        return result

    if emit is not None:
        registry.methods["event.emit"] = Method(emit.name, emit.params, emitted, emit.scope)
    if batch is not None:
        registry.methods["event.emitBatch"] = Method(batch.name, batch.params, batched, batch.scope)
