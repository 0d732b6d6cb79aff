"""The typed methods, each a call of its JSON-RPC method, and iterators over paged replies; `Client` inherits them.

Every declared method (api/) has one here or in coordination.py, with the result type the daemon declares
(results.py); tests/test_client_methods.py keeps the two lists equal. The subscriptions (`session.subscribe`,
`.unsubscribe`, `sessions.watch`) are `Client.subscribe` and `Client.watch`.

A list the daemon returns in pages (`session.get`'s events, `session.list`'s sessions, `bridge.isolate`'s
events) has a method for one page, which hands back the next page's cursor as the daemon sent it, and an
`iter_*` async iterator that follows the cursors and yields every item once, in the daemon's order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

from memento_sessions.client.results import (
    AtView,
    Checkpoint,
    Cleared,
    Commit,
    Compacted,
    Conversation,
    Created,
    Diff,
    Discovered,
    Emitted,
    EmittedBatch,
    Empty,
    Forked,
    Handoff,
    Isolated,
    Joined,
    Moved,
    Outcomes,
    SessionDetail,
    SessionList,
    Snapshotted,
    Upserted,
    Usage,
)
from memento_sessions.client.wire import Result, compact


class Methods:
    """`session.*`, `event.*`, `bridge.*` and `kg.upsert` by name, over `call`."""

    async def call(self, method: str, params: Mapping[str, Any] | None = None, *, retry: bool = False) -> Result:
        """Send `method` and await its result; `Client` implements it."""
        raise NotImplementedError

    async def create_session(self, entity_ids: Sequence[str] | None = None, *, session_id: str | None = None,
                             ttl: int | None = None, labels: Mapping[str, str] | None = None,
                             on_idle: str | None = None) -> Created:
        """`session.create`: {sessionId, state, seq, agentIds, expiresAt, epoch}."""
        params = compact(entityIds=entity_ids, sessionId=session_id, ttl=ttl, labels=labels, onIdle=on_idle)
        return cast(Created, await self.call("session.create", params))

    async def join(self, session_id: str) -> Joined:
        """`session.join`: {sessionId, agentIds, state, seq}."""
        return cast(Joined, await self.call("session.join", {"sessionId": session_id}, retry=True))

    async def leave(self, session_id: str) -> Empty:
        """`session.leave`: {}."""
        return cast(Empty, await self.call("session.leave", {"sessionId": session_id}, retry=True))

    async def get(self, session_id: str, *, condensed: bool = False, since: int | None = None,
                  limit: int | None = None) -> SessionDetail:
        """`session.get`: {session, events, nextSince?}, one page of the events after `since` (`nextSince`, when
        present, is the `since` of the next page; `iter_events` follows it), or the condensed view."""
        params = compact(sessionId=session_id, condensed=condensed or None, since=since, limit=limit)
        return cast(SessionDetail, await self.call("session.get", params, retry=True))

    async def get_at(self, session_id: str, at_seq: int) -> AtView:
        """`session.get {atSeq}`: the session as it was right after event `at_seq` (time travel)."""
        return cast(AtView, await self.call("session.get", {"sessionId": session_id, "atSeq": at_seq}, retry=True))

    async def iter_events(self, session_id: str, since: int = 0, *, limit: int | None = None) -> AsyncIterator[Result]:
        """Every event of the session after `since`, in seq order, read a page (`limit` events) at a time."""
        params = compact(sessionId=session_id, since=since, limit=limit)
        async for event in self._follow("session.get", params, "events", "nextSince", "since"):
            yield event

    async def list_sessions_page(self, *, state: str | None = None, agent_id: str | None = None,
                                 limit: int | None = None, cursor: str | None = None,
                                 status: str | None = None) -> SessionList:
        """`session.list`: {sessions, nextCursor?}, one page newest first; pass `nextCursor` back as `cursor`
        (with the same filters) for the next. `status`: active, suspended, completed or archived."""
        params = compact(state=state, agentId=agent_id, limit=limit, cursor=cursor, status=status)
        return cast(SessionList, await self.call("session.list", params, retry=True))

    async def list_sessions(self, *, state: str | None = None, agent_id: str | None = None,
                            limit: int | None = None, cursor: str | None = None) -> list[Result]:
        """`session.list`: one page of sessions, newest first (`iter_sessions` gives them all)."""
        page = await self.list_sessions_page(state=state, agent_id=agent_id, limit=limit, cursor=cursor)
        return cast(list[Result], page["sessions"])

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

    async def emit(self, session_id: str, event: Mapping[str, Any]) -> Emitted:
        """`event.emit`: {seq, duplicate}; retried across a reconnect only when the event has an `id`."""
        params = {"sessionId": session_id, "event": event}
        return cast(Emitted, await self.call("event.emit", params, retry="id" in event))

    async def emit_batch(self, session_id: str, events: Sequence[Mapping[str, Any]]) -> EmittedBatch:
        """`event.emitBatch`: {seqs}; retried across a reconnect only when every event has an `id`."""
        params = {"sessionId": session_id, "events": events}
        return cast(EmittedBatch, await self.call("event.emitBatch", params, retry=all("id" in e for e in events)))

    async def usage(self, *, session_id: str | None = None, agent_id: str | None = None, since: str | None = None,
                    cursor: str | None = None, limit: int | None = None) -> Usage:
        """`usage.get`: {totals, bySource, runs, nextCursor?} of a session, an agent, or (neither) the namespace."""
        params = compact(sessionId=session_id, agentId=agent_id, since=since, cursor=cursor, limit=limit)
        return cast(Usage, await self.call("usage.get", params, retry=True))

    async def checkpoint(self, session_id: str, *, final: bool = False) -> Checkpoint:
        """`session.checkpoint`: {checkpointId, outcome, brokeDuring, keyImpacts, perfDelta, actors, ...}."""
        params = compact(sessionId=session_id, final=final or None)
        return cast(Checkpoint, await self.call("session.checkpoint", params))

    async def transitions(self, session_id: str, entity_id: str | None = None) -> list[Result]:
        """`bridge.transitions`: [{fromSeq, toSeq, changeInfo, impact, kgContext?}]."""
        result = await self.call("bridge.transitions", compact(sessionId=session_id, entityId=entity_id),
                                 retry=True)
        return cast(list[Result], result["transitions"])

    async def isolate(self, session_id: str, agent_id: str, *, since: int | None = None,
                      limit: int | None = None) -> Isolated:
        """`bridge.isolate`: {agentId, events, nextSince?, impacts, totalPerfDelta, source}; `events` is one page
        of the agent's events after `since` (`iter_isolated` follows nextSince), the rest covers all of them."""
        params = compact(sessionId=session_id, agentId=agent_id, since=since, limit=limit)
        return cast(Isolated, await self.call("bridge.isolate", params, retry=True))

    async def iter_isolated(self, session_id: str, agent_id: str, since: int = 0, *,
                            limit: int | None = None) -> AsyncIterator[Result]:
        """Every event of `agent_id` in the session after `since`, in seq order, a page at a time."""
        params = compact(sessionId=session_id, agentId=agent_id, since=since, limit=limit)
        async for event in self._follow("bridge.isolate", params, "events", "nextSince", "since"):
            yield event

    async def handoff(self, session_id: str, *, head: str | None = None, dirty_digest: str | None = None) -> Handoff:
        """`bridge.handoff`: {sessionId, state, agentIds, recentChanges, kgContext, joiningAdvice, leases, freshness,
        ...}; given the receiver's git `head` (and `dirty_digest`), freshness says fresh, behind or diverged."""
        params = compact(sessionId=session_id, head=head, dirtyDigest=dirty_digest)
        return cast(Handoff, await self.call("bridge.handoff", params, retry=True))

    async def outcomes(self, cluster_id: str, days: int | None = None) -> Outcomes:
        """`bridge.outcomes`: {clusterName, specTitles, recentSessions, avgPerfDelta, brokenCount}."""
        return cast(Outcomes, await self.call("bridge.outcomes", compact(clusterId=cluster_id, days=days), retry=True))

    async def commit(self, sha: str) -> Commit:
        """`bridge.commit`: {sha, sessionId, seq, agentId, recordedAt} of the session that produced the commit."""
        return cast(Commit, await self.call("bridge.commit", {"sha": sha}, retry=True))

    async def kg_upsert(self, nodes: Sequence[Mapping[str, Any]] | None = None,
                        edges: Sequence[Mapping[str, Any]] | None = None) -> Upserted:
        """`kg.upsert` (scope kg:write): {nodes, edges} counts; upserts are idempotent, so retried."""
        return cast(Upserted, await self.call("kg.upsert", compact(nodes=nodes, edges=edges), retry=True))

    async def conversation(self, session_id: str, *, subagent_id: str | None = None, cursor: int | None = None,
                           limit: int | None = None) -> Conversation:
        """`session.conversation`: one page of an ingested agent's blocks (`nextCursor` when more follow)."""
        params = compact(sessionId=session_id, subagentId=subagent_id, cursor=cursor, limit=limit)
        return cast(Conversation, await self.call("session.conversation", params, retry=True))

    async def diff(self, session_id: str, from_seq: int, to_seq: int) -> Diff:
        """`session.diff`: what happened after `from_seq` up to `to_seq`."""
        params = {"sessionId": session_id, "fromSeq": from_seq, "toSeq": to_seq}
        return cast(Diff, await self.call("session.diff", params, retry=True))

    async def snapshot(self, session_id: str) -> Snapshotted:
        """`session.snapshot`: the condensed state stored at the current seq (safe to repeat, so retried)."""
        return cast(Snapshotted, await self.call("session.snapshot", {"sessionId": session_id}, retry=True))

    async def compact(self, session_id: str, before_seq: int | None = None) -> Compacted:
        """`session.compact`: the events up to `before_seq` (default: all but the last MEMENTO_COMPACT_KEEP) removed."""
        return cast(Compacted, await self.call("session.compact", compact(sessionId=session_id, beforeSeq=before_seq)))

    async def fork(self, session_id: str, at_seq: int, new_session_id: str | None = None) -> Forked:
        """`session.fork`: a new session holding the events 1..`at_seq`."""
        params = compact(sessionId=session_id, atSeq=at_seq, newSessionId=new_session_id)
        return cast(Forked, await self.call("session.fork", params))

    async def suspend(self, session_id: str) -> Moved:
        """`session.suspend`: the session moved to Postgres (safe to repeat, so retried)."""
        return cast(Moved, await self.call("session.suspend", {"sessionId": session_id}, retry=True))

    async def resume(self, session_id: str) -> Moved:
        """`session.resume`: a suspended session back in Redis, same seqs and epoch."""
        return cast(Moved, await self.call("session.resume", {"sessionId": session_id}))

    async def clear(self, session_id: str) -> Cleared:
        """`session.clear` (scope admin): the session deleted from Redis and Postgres."""
        return cast(Cleared, await self.call("session.clear", {"sessionId": session_id}))

    async def discover(self) -> Discovered:
        """`rpc.discover`: the OpenRPC 1.3 document of the daemon's whole API."""
        return cast(Discovered, await self.call("rpc.discover", retry=True))
