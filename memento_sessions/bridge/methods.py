"""JSON-RPC methods over the SessionBridge: bridge.transitions, .isolate, .handoff, .outcomes and .commit (declared
in api/).

bridge.commit reads the commit index (commits.py), which the emit methods feed through their declared step
`note_commits`: each stored `commit` event is noted once its write succeeded."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints, model_validator

from memento_sessions.bridge.bridge import SessionBridge
from memento_sessions.bridge.commits import Commits, commit_sha
from memento_sessions.rpc import Call, Handler, Result
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


class BridgeMethods:
    """The bridge methods; each reads only the caller's namespace."""

    def __init__(self, bridge: SessionBridge) -> None:
        self.bridge = bridge
        self.commits = Commits(bridge.manager.redis, bridge.manager.settings.commits_max)

    async def transitions(self, call: Call, p: TransitionsParams) -> Result:
        return await self.bridge.transitions(call.identity.namespace, p.sessionId, p.entityId)

    async def isolate(self, call: Call, p: IsolateParams) -> Result:
        """The agent's events and impacts, with its share of the session's usage (null when none is kept)."""
        result = await self.bridge.isolate(call.identity.namespace, p.sessionId, p.agentId, p.since, p.limit)
        manager = self.bridge.manager
        share = await agent_share(manager.redis, call.identity.namespace, p.sessionId, p.agentId,
                                  manager.settings.usage_agents_per_session)
        return {**result, "usage": share["totals"] if share is not None else None}

    async def handoff(self, call: Call, p: HandoffParams) -> Result:
        result = await self.bridge.handoff(call.identity.namespace, p.sessionId, p.head, p.dirtyDigest)
        return {**result, "usage": await self.usage(call, p.sessionId)}

    async def outcomes(self, call: Call, p: OutcomesParams) -> Result:
        return await self.bridge.outcomes(call.identity.namespace, p.clusterId, p.days)

    async def commit(self, call: Call, p: CommitParams) -> Result:
        return await self.commits.find(call.identity.namespace, p.sha)

    async def usage(self, call: Call, session_id: str) -> Result:
        """The session's usage totals (usage.get), which handoff carries."""
        found = await session_totals(self.bridge.manager.redis, call.identity.namespace, session_id)
        totals: Result = found["totals"]
        return totals


def note_commits(commits: Commits, inner: Handler) -> Handler:
    """event.emit and .emitBatch: each `commit` event they stored (not a duplicate) noted in the commit index."""
    async def handler(call: Call, params: Any) -> Result:
        result = await inner(call, params)
        events = [params.event] if hasattr(params, "event") else params.events
        seqs = [result["seq"]] if "seq" in result else result["seqs"]
        duplicates = set(result.get("duplicates", ())) | ({result["seq"]} if result.get("duplicate") else set())
        for seq, event in zip(seqs, events, strict=True):
            if (sha := commit_sha(event)) and seq not in duplicates:
                await commits.note(call.identity.namespace, params.sessionId, seq, sha, call.identity.agent_id)
        return result
    return handler
