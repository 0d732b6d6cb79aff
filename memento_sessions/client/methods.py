"""The methods of SPEC section 6, each a typed call of its JSON-RPC method; `Client` inherits them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memento_sessions.client.wire import Result, compact


class Methods:
    """`session.*`, `event.*`, `bridge.*` and `kg.upsert` by name, over `call`."""

    async def call(self, method: str, params: Mapping[str, Any] | None = None, *, retry: bool = False) -> Result:
        """Send `method` and await its result; `Client` implements it."""
        raise NotImplementedError

    async def create_session(self, entity_ids: Sequence[str] | None = None, *, session_id: str | None = None,
                             ttl: int | None = None, labels: Mapping[str, str] | None = None) -> Result:
        """`session.create`: {sessionId, state, seq, agentIds, expiresAt}."""
        return await self.call("session.create", compact(entityIds=entity_ids, sessionId=session_id, ttl=ttl,
                                                         labels=labels))

    async def join(self, session_id: str) -> Result:
        """`session.join`: {sessionId, agentIds, state, seq}."""
        return await self.call("session.join", {"sessionId": session_id}, retry=True)

    async def leave(self, session_id: str) -> Result:
        """`session.leave`: {}."""
        return await self.call("session.leave", {"sessionId": session_id}, retry=True)

    async def get(self, session_id: str, *, condensed: bool = False, since: int | None = None,
                  limit: int | None = None) -> Result:
        """`session.get`: {session, events}, or the condensed view."""
        params = compact(sessionId=session_id, condensed=condensed or None, since=since, limit=limit)
        return await self.call("session.get", params, retry=True)

    async def list_sessions(self, *, state: str | None = None, agent_id: str | None = None,
                            limit: int | None = None) -> list[Result]:
        """`session.list`: the sessions, newest first."""
        result = await self.call("session.list", compact(state=state, agentId=agent_id, limit=limit), retry=True)
        sessions: list[Result] = result["sessions"]
        return sessions

    async def emit(self, session_id: str, event: Mapping[str, Any]) -> Result:
        """`event.emit`: {seq, duplicate}; retried across a reconnect only when the event has an `id`."""
        params = {"sessionId": session_id, "event": event}
        return await self.call("event.emit", params, retry="id" in event)

    async def emit_batch(self, session_id: str, events: Sequence[Mapping[str, Any]]) -> Result:
        """`event.emitBatch`: {seqs}; retried across a reconnect only when every event has an `id`."""
        params = {"sessionId": session_id, "events": events}
        return await self.call("event.emitBatch", params, retry=all("id" in event for event in events))

    async def checkpoint(self, session_id: str, *, final: bool = False) -> Result:
        """`session.checkpoint`: {checkpointId, outcome, brokeDuring, keyImpacts, perfDelta, actors, ...}."""
        return await self.call("session.checkpoint", compact(sessionId=session_id, final=final or None))

    async def transitions(self, session_id: str, entity_id: str | None = None) -> list[Result]:
        """`bridge.transitions`: [{fromSeq, toSeq, changeInfo, impact, kgContext?}]."""
        result = await self.call("bridge.transitions", compact(sessionId=session_id, entityId=entity_id),
                                 retry=True)
        transitions: list[Result] = result["transitions"]
        return transitions

    async def isolate(self, session_id: str, agent_id: str) -> Result:
        """`bridge.isolate`: {agentId, events, impacts, totalPerfDelta}."""
        return await self.call("bridge.isolate", {"sessionId": session_id, "agentId": agent_id}, retry=True)

    async def handoff(self, session_id: str) -> Result:
        """`bridge.handoff`: {sessionId, state, agentIds, recentChanges, kgContext, joiningAdvice}."""
        return await self.call("bridge.handoff", {"sessionId": session_id}, retry=True)

    async def outcomes(self, cluster_id: str, days: int | None = None) -> Result:
        """`bridge.outcomes`: {clusterName, specTitles, recentSessions, avgPerfDelta, brokenCount}."""
        return await self.call("bridge.outcomes", compact(clusterId=cluster_id, days=days), retry=True)

    async def kg_upsert(self, nodes: Sequence[Mapping[str, Any]] | None = None,
                        edges: Sequence[Mapping[str, Any]] | None = None) -> Result:
        """`kg.upsert` (scope kg:write): {nodes, edges} counts; upserts are idempotent, so retried."""
        return await self.call("kg.upsert", compact(nodes=nodes, edges=edges), retry=True)
