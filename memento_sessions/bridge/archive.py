"""Where a session is read from: its live Redis keys, or, once they expired, its anchors and snapshots.

A broken session leaves one snapshot row per broken checkpoint, each with only the events after the
previous one (checkpoints/snapshots.py); the archive reads them joined: every event of the session's
newest epoch that a snapshot holds, once, in seq order."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from memento_sessions.bridge.cache import EventCache, Hint, decode
from memento_sessions.bridge.queries import SESSION_ANCHORS
from memento_sessions.bridge.timeline import Breakage, Event
from memento_sessions.checkpoints.snapshots import Snapshot, Snapshots
from memento_sessions.errors import NotFound
from memento_sessions.kg.graph import Graphs
from memento_sessions.sessions.manager import SessionManager

Anchor = dict[str, Any]


@dataclass
class Record:
    """A session as the bridge sees it: its view, its events in seq order and where they came from."""

    session: dict[str, Any]
    events: list[Event]
    source: Literal["live", "archive"]
    anchors: list[Anchor] | None = None  # loaded with the archive; the live path asks when it needs them
    snapshot: str | None = None  # checkpoint id of the newest failure snapshot used, if any
    breaks: list[Breakage] | None = None  # every breakage of `events`, when already known


async def read_live(manager: SessionManager, namespace: str, session_id: str, tail: int | None) -> Record:
    """The live session with every event, or only its last `tail` events; NotFound once it expired."""
    if tail is None:
        session, members = await manager.read(namespace, session_id)
    else:
        session, members = await manager.tail(namespace, session_id, tail)
    return Record(session, decode(members), "live")


async def read_breaks(manager: SessionManager, cache: EventCache, namespace: str, session_id: str,
                      hint: Hint | None = None) -> Record:
    """The live session with its breakages but no events (the cache folds only new ones, handing their
    windows to `hint` as it goes); NotFound once it expired."""
    session, entry = await cache.read(manager, namespace, session_id, hint)
    return Record(session, [], "live", breaks=entry.fold.breakages())


async def session_anchors(graphs: Graphs, namespace: str, session_id: str) -> list[Anchor]:
    """Every anchor the session left in the namespace's graph, oldest first, each with its `entityIds`."""
    rows = await graphs.rows(namespace, SESSION_ANCHORS, {"sessionId": session_id})
    anchors = [{**props, "entityIds": sorted(ids)} for props, ids in rows]
    return sorted(anchors, key=lambda a: (stamp(a), str(a.get("checkpointId"))))


def stamp(anchor: Anchor) -> float:
    """An anchor's timestamp in epoch ms, whether stored as a number or as ISO-8601 text (0 if neither)."""
    value = anchor.get("timestamp")
    if isinstance(value, int | float):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1000
    except ValueError:
        return 0.0


async def latest_snapshot(snapshots: Snapshots, namespace: str, session_id: str) -> Snapshot | None:
    """The session's failure snapshots joined (its newest epoch); None when it has none or Postgres is off."""
    if not snapshots.postgres.enabled:
        return None
    return await snapshots.latest_snapshot(namespace, session_id)


async def read_archive(snapshots: Snapshots, graphs: Graphs, namespace: str, session_id: str) -> Record:
    """The expired session rebuilt from its anchors and failure snapshots; NotFound when it left neither."""
    anchors = await session_anchors(graphs, namespace, session_id)
    snapshot = await latest_snapshot(snapshots, namespace, session_id)
    if not anchors and snapshot is None:
        raise NotFound(f"session {session_id!r} not found, live or archived", {"sessionId": session_id})
    events = sorted(snapshot.events, key=event_seq) if snapshot else []
    session = archived_view(session_id, anchors, snapshot, events)
    return Record(session, events, "archive", anchors, snapshot.checkpoint_id if snapshot else None)


def event_seq(event: Event) -> int:
    """An archived event's seq (0 when it has none)."""
    return int(event.get("seq") or 0)


def archived_view(session_id: str, anchors: list[Anchor], snapshot: Snapshot | None,
                  events: list[Event]) -> dict[str, Any]:
    """The session object as far as the archive knows it: its last state, every actor, the highest seq."""
    return {"sessionId": session_id, "state": archived_state(anchors, snapshot),
            "agentIds": archived_agents(anchors, events), "seq": archived_seq(anchors, events)}


def archived_agents(anchors: list[Anchor], events: list[Event]) -> list[str]:
    """Every actor an anchor names or an archived event has, sorted."""
    agents = {actor for anchor in anchors for actor in anchor.get("actors") or []}
    return sorted(agents | {str(event["actor"]) for event in events if event.get("actor")})


def archived_seq(anchors: list[Anchor], events: list[Event]) -> int:
    """The highest seq an anchor covers or an archived event has (0 when none does)."""
    return max([int(a.get("toSeq") or 0) for a in anchors] + [event_seq(e) for e in events], default=0)


def archived_state(anchors: list[Anchor], snapshot: Snapshot | None) -> Any:
    """The newest anchor's outcome, else the snapshot's (None when neither says)."""
    if anchors:
        return anchors[-1].get("outcome")
    return snapshot.outcome if snapshot else None
