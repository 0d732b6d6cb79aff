"""The typed methods, each a call of its JSON-RPC method, and iterators over paged replies; `Client` inherits them.

A list the daemon returns in pages (`session.get`'s events, `session.list`'s sessions, `bridge.isolate`'s
events) has a method for one page, which hands back the next page's cursor as the daemon sent it, and an
`iter_*` async iterator that follows the cursors and yields every item once, in the daemon's order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
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
        """`session.get`: {session, events, nextSince?}, one page of the events after `since` (`nextSince`, when
        present, is the `since` of the next page; `iter_events` follows it), or the condensed view."""
        params = compact(sessionId=session_id, condensed=condensed or None, since=since, limit=limit)
        return await self.call("session.get", params, retry=True)

    async def iter_events(self, session_id: str, since: int = 0, *, limit: int | None = None) -> AsyncIterator[Result]:
        """Every event of the session after `since`, in seq order, read a page (`limit` events) at a time."""
        params = compact(sessionId=session_id, since=since, limit=limit)
        async for event in self._follow("session.get", params, "events", "nextSince", "since"):
            yield event

    async def list_sessions_page(self, *, state: str | None = None, agent_id: str | None = None,
                                 limit: int | None = None, cursor: str | None = None) -> Result:
        """`session.list`: {sessions, nextCursor?}, one page newest first; pass `nextCursor` back as `cursor`
        (with the same filters) for the next."""
        params = compact(state=state, agentId=agent_id, limit=limit, cursor=cursor)
        return await self.call("session.list", params, retry=True)

    async def list_sessions(self, *, state: str | None = None, agent_id: str | None = None,
                            limit: int | None = None, cursor: str | None = None) -> list[Result]:
        """`session.list`: one page of sessions, newest first (`iter_sessions` gives them all)."""
        page = await self.list_sessions_page(state=state, agent_id=agent_id, limit=limit, cursor=cursor)
        sessions: list[Result] = page["sessions"]
        return sessions

    async def iter_sessions(self, *, state: str | None = None, agent_id: str | None = None,
                            limit: int | None = None) -> AsyncIterator[Result]:
        """Every live session of the namespace (matching the filters), newest first, `limit` a page."""
        params = compact(state=state, agentId=agent_id, limit=limit)
        async for session in self._follow("session.list", params, "sessions", "nextCursor", "cursor"):
            yield session

    async def _follow(self, method: str, params: Result, items: str, next_key: str,
                      param: str) -> AsyncIterator[Result]:
        """The `items` of every page of `method`, each page asked with the previous one's `next_key` as `param`."""
        while True:
            page = await self.call(method, params, retry=True)
            for item in page[items]:
                yield item
            if page.get(next_key) is None:
                return
            params = {**params, param: page[next_key]}

    async def emit(self, session_id: str, event: Mapping[str, Any]) -> Result:
        """`event.emit`: {seq, duplicate}; retried across a reconnect only when the event has an `id`."""
        params = {"sessionId": session_id, "event": event}
        return await self.call("event.emit", params, retry="id" in event)

    async def emit_batch(self, session_id: str, events: Sequence[Mapping[str, Any]]) -> Result:
        """`event.emitBatch`: {seqs}; retried across a reconnect only when every event has an `id`."""
        params = {"sessionId": session_id, "events": events}
        return await self.call("event.emitBatch", params, retry=all("id" in event for event in events))

    async def usage(self, *, session_id: str | None = None, agent_id: str | None = None, since: str | None = None,
                    cursor: str | None = None, limit: int | None = None) -> Result:
        """`usage.get`: {totals, bySource, runs, nextCursor?} of a session, an agent, or (neither) the namespace."""
        params = compact(sessionId=session_id, agentId=agent_id, since=since, cursor=cursor, limit=limit)
        return await self.call("usage.get", params, retry=True)

    async def checkpoint(self, session_id: str, *, final: bool = False) -> Result:
        """`session.checkpoint`: {checkpointId, outcome, brokeDuring, keyImpacts, perfDelta, actors, ...}."""
        return await self.call("session.checkpoint", compact(sessionId=session_id, final=final or None))

    async def transitions(self, session_id: str, entity_id: str | None = None) -> list[Result]:
        """`bridge.transitions`: [{fromSeq, toSeq, changeInfo, impact, kgContext?}]."""
        result = await self.call("bridge.transitions", compact(sessionId=session_id, entityId=entity_id),
                                 retry=True)
        transitions: list[Result] = result["transitions"]
        return transitions

    async def isolate(self, session_id: str, agent_id: str, *, since: int | None = None,
                      limit: int | None = None) -> Result:
        """`bridge.isolate`: {agentId, events, nextSince?, impacts, totalPerfDelta, source}; `events` is one page
        of the agent's events after `since` (`iter_isolated` follows nextSince), the rest covers all of them."""
        params = compact(sessionId=session_id, agentId=agent_id, since=since, limit=limit)
        return await self.call("bridge.isolate", params, retry=True)

    async def iter_isolated(self, session_id: str, agent_id: str, since: int = 0, *,
                            limit: int | None = None) -> AsyncIterator[Result]:
        """Every event of `agent_id` in the session after `since`, in seq order, a page at a time."""
        params = compact(sessionId=session_id, agentId=agent_id, since=since, limit=limit)
        async for event in self._follow("bridge.isolate", params, "events", "nextSince", "since"):
            yield event

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

    async def message_status(self, message_id: str) -> Result:
        """`mailbox.status`: {messageId, recipients: [{agentId, stored, pushed, surfaced, acked}]} (ISO times or
        None) of a message this agent sent."""
        return await self.call("mailbox.status", {"messageId": message_id}, retry=True)
