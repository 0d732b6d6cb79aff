"""SessionBridge: the questions agents ask about a session, answered from Redis events and the KG.

Each query reads the live session through the SessionManager and, once its Redis keys expired,
falls back to the session's KG anchors and Postgres failure snapshot; its result says which with
`"source": "live"` or `"archive"`. Each costs one Redis and one graph round trip when live.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from memento_sessions.backends import Backends
from memento_sessions.bridge import advice
from memento_sessions.bridge.archive import Anchor, Record, read_archive, read_breaks, read_live, session_anchors, stamp
from memento_sessions.bridge.cache import DEFAULT_BYTES, EventCache, Hint
from memento_sessions.bridge.context import Context, TransitionContext
from memento_sessions.bridge.freshness import freshness
from memento_sessions.bridge.queries import CLUSTER_OUTCOMES, HANDOFF_CONTEXT
from memento_sessions.bridge.timeline import Event, breakages, by_actor, perf_sum, touched
from memento_sessions.checkpoints.snapshots import Snapshots
from memento_sessions.errors import NotFound
from memento_sessions.kg.graph import Graphs
from memento_sessions.metrics import BRIDGE_QUERY_SECONDS, REPLY_PAGES
from memento_sessions.sessions.manager import SessionManager, iso, now_ms
from memento_sessions.sessions.paging import PAGE, Page, page_bytes

Result = dict[str, Any]
RECENT = 10
DAY_MS = 86_400_000


@contextmanager
def timed(query: str) -> Iterator[None]:
    """Observe the block's duration into memento_bridge_query_seconds{query}."""
    started = time.perf_counter()
    try:
        yield
    finally:
        BRIDGE_QUERY_SECONDS.labels(query).observe(time.perf_counter() - started)


class SessionBridge:
    """transitions, isolate, handoff and outcomes over one daemon's manager and backends."""

    def __init__(self, manager: SessionManager, backends: Backends, cache_events: int = 0,
                 cache_bytes: int = DEFAULT_BYTES, *, graphs: Graphs | None = None,
                 snapshots: Snapshots | None = None) -> None:
        """`graphs` and `snapshots`: the daemon's one instance of each (server/services.py); a caller of its
        own (a test, a bench) may leave them out."""
        self.manager = manager
        self.cache = EventCache(cache_events, cache_bytes)
        self.graphs = graphs or Graphs(backends)  # reads only the caller's namespace graph, in compact form
        self.snapshots = snapshots or Snapshots(backends.postgres)

    async def transitions(self, ns: str, session_id: str, entity_id: str | None = None) -> Result:
        """Every working-to-broken transition, with the KG context of the entities changed before it."""
        with timed("transitions"):
            queries = TransitionContext(self.graphs, ns)
            try:
                record = await self._record(ns, session_id, breaks_only=entity_id is None, hint=queries.ask)
                found = record.breaks if record.breaks is not None else breakages(record.events, entity_id)
                items = [b.view() for b in found]
                windows = [list(b.window) for b in found]
                if not record.events and record.anchors:
                    items, windows = anchor_breakages(record.anchors, entity_id)
                context = await queries.result(windows)
            finally:
                queries.cancel()
            for item, window in zip(items, windows, strict=True):
                if kg := merge_context(context, window):
                    item["kgContext"] = kg
            return {"transitions": items, "source": record.source}

    async def isolate(self, ns: str, session_id: str, agent_id: str, since: int = 0,
                      limit: int | None = None) -> Result:
        """One agent's events after `since` (a page: at most `limit`, 1,000 by default, and a quarter of the
        send buffer in bytes, with `nextSince` when more exist), the anchors of each entity it touched, and
        its total perfDelta (impacts and total always cover all its events)."""
        with timed("isolate"):
            record = await self._record(ns, session_id)
            anchors = record.anchors if record.anchors is not None else await session_anchors(
                self.graphs, ns, session_id)
            mine = by_actor(record.events, agent_id)
            theirs = [a for a in anchors if agent_id in (a.get("actors") or [])]
            # Without the agent's events (expired, no snapshot) its anchors are all that says what it touched.
            entities = touched(mine) if mine else [entity for a in theirs for entity in a["entityIds"]]
            impacts = []
            for entity in sorted(set(entities)):
                found = [anchor_view(a) for a in reversed(theirs) if entity in a["entityIds"]]
                impacts.append({"entityId": entity, "anchors": found, "count": len(found)})
            total = perf_sum(mine) if mine else sum(float(a.get("perfDelta") or 0.0) for a in theirs)
            result = {"agentId": agent_id, "events": [], "impacts": impacts, "totalPerfDelta": total,
                      "source": record.source}
            return self._paged(result, mine, since, limit)

    def _paged(self, result: Result, events: Sequence[Event], since: int, limit: int | None) -> Result:
        """`result` with a page of `events` (seq > since) and `nextSince` when more remain."""
        page = Page(limit or PAGE, page_bytes(self.manager.settings.ws_send_buffer))
        for event in events:
            if int(event.get("seq") or 0) > since and not page.add(event):
                result["nextSince"] = page.items[-1]["seq"]
                REPLY_PAGES.labels("bridge.isolate").inc()
                break
        result["events"] = page.items
        return result

    async def handoff(self, ns: str, session_id: str, head: str | None = None, digest: str | None = None) -> Result:
        """What a joining agent needs: state, agents, the last 10 events and the KG around what they changed,
        and how fresh the agent's recorded git state is (compared with the receiver's `head` and `digest`)."""
        with timed("handoff"):
            record = await self._record(ns, session_id, tail=RECENT)
            recent = record.events[-RECENT:]
            ids = touched(recent) or (record.anchors[-1]["entityIds"] if record.anchors else [])
            context = await self._handoff_context(ns, ids)
            session = record.session
            fresh = None if record.source != "live" else await freshness(
                self.manager, ns, session, self.manager.settings.handoff_freshness_scan, head, digest)
            return {"sessionId": session_id, "state": session["state"], "agentIds": session["agentIds"],
                    "recentChanges": recent, "kgContext": context,
                    "joiningAdvice": advice.joining(record, recent, ids), "freshness": fresh, "source": record.source}

    async def outcomes(self, ns: str, cluster_id: str, days: int = 7) -> Result:
        """A cluster's name, its specs' titles and the anchors its members got in the last `days` days."""
        with timed("outcomes"):
            since = now_ms() - days * DAY_MS
            rows = await self.graphs.rows(ns, CLUSTER_OUTCOMES, {"clusterId": cluster_id, "sinceIso": iso(since),
                                                                 "sinceMs": since})
            name, titles, pairs = rows[0] if rows else (None, [], [])
            recent = cluster_anchors(pairs)
            deltas = [float(a["perfDelta"]) for a in recent if isinstance(a.get("perfDelta"), int | float)]
            return {"clusterName": name, "specTitles": sorted(titles), "recentSessions": recent,
                    "avgPerfDelta": sum(deltas) / len(deltas) if deltas else None,
                    "brokenCount": sum(1 for a in recent if a.get("outcome") == "broken")}

    async def _record(self, ns: str, session_id: str, tail: int | None = None, breaks_only: bool = False,
                      hint: Hint | None = None) -> Record:
        try:
            if breaks_only:
                return await read_breaks(self.manager, self.cache, ns, session_id, hint)
            return await read_live(self.manager, ns, session_id, tail)
        except NotFound:
            return await read_archive(self.snapshots, self.graphs, ns, session_id)

    async def _handoff_context(self, ns: str, ids: Sequence[str]) -> list[Result]:
        if not ids:
            return []
        rows = await self.graphs.rows(ns, HANDOFF_CONTEXT, {"ids": list(ids)})
        found = {eid: {"entityId": eid, "related": related_view(related), "lastAnchor": last and iso_stamped(last)}
                 for eid, related, last in rows}
        return [found[eid] for eid in ids if eid in found]


def merge_context(context: Context, window: Sequence[str]) -> Result | None:
    """Specs, clusters and benchmarks around the window's entities; None when the graph knows none of them."""
    known = [entity for entity in window if any(context.get(entity, {}).values())]
    if not known:
        return None
    specs = {title for e in known for title in context[e]["specs"] if title is not None}
    clusters = {name for e in known for name in context[e]["clusters"] if name is not None}
    benchmarks = {bid: delta for e in known for bid, delta in context[e]["benchmarks"].items()}
    return {"entityIds": known, "specTitles": sorted(specs), "clusterNames": sorted(clusters),
            "benchmarkDelta": math.fsum(delta or 0.0 for delta in benchmarks.values())}  # the same in any order


def anchor_breakages(anchors: Sequence[Anchor], entity_id: str | None) -> tuple[list[Result], list[list[str]]]:
    """Transitions known only from anchors (no events left): each checkpoint window that broke, by its seqs."""
    items: list[Result] = []
    windows: list[list[str]] = []
    for anchor in anchors:
        if anchor.get("brokeDuring") and (entity_id is None or entity_id in anchor["entityIds"]):
            items.append({"fromSeq": anchor.get("fromSeq"), "toSeq": anchor.get("toSeq"),
                          "checkpointId": anchor.get("checkpointId"),
                          "changeInfo": {"entityIds": anchor["entityIds"]},
                          "impact": {"perfDelta": anchor.get("perfDelta"), "keyImpacts": anchor.get("keyImpacts")}})
            windows.append(anchor["entityIds"])
    return items, windows


def anchor_view(anchor: Anchor) -> Anchor:
    """An anchor's own properties, without the entity list the bridge joined to it."""
    return {key: value for key, value in anchor.items() if key != "entityIds"}


def related_view(rows: Sequence[Sequence[Any]]) -> list[Result]:
    """`[label, relationship, id, name, perfDelta]` rows as maps, sorted by label then id."""
    seen: dict[tuple[str, str], Result] = {}
    for label, relation, node_id, name, perf in rows:
        if node_id is None:
            continue
        item: Result = {"id": node_id, "label": label, "relation": relation, "name": name}
        if label == "Benchmark":
            item["perfDelta"] = perf
        seen[(label, node_id)] = item
    return [seen[key] for key in sorted(seen)]


def cluster_anchors(pairs: Sequence[Sequence[Any]]) -> list[Anchor]:
    """Distinct anchors (by checkpointId) with the member entities each touched, newest first."""
    merged: dict[str, Anchor] = {}
    for entity, props in pairs:
        if props is None:
            continue
        anchor = merged.setdefault(str(props.get("checkpointId")), {**props, "entityIds": []})
        anchor["entityIds"] = sorted({*anchor["entityIds"], entity})
    return [iso_stamped(a) for a in sorted(merged.values(), key=lambda a: (-stamp(a), str(a.get("checkpointId"))))]


def iso_stamped(anchor: Anchor) -> Anchor:
    """An anchor as a reply shows it: its timestamp as ISO-8601 text, as every method's (the graph keeps it in
    epoch ms)."""
    value = anchor.get("timestamp")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {**anchor, "timestamp": iso(int(value))}
    return anchor
