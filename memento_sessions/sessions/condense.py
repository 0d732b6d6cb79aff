"""The condensed view of a session: what happened, without every event.

This is the session's one reducer: the live condensed view, `session.get {atSeq}` (time travel),
`session.diff` and the snapshots that compaction keeps all fold events through `Condenser`, so a view
rebuilt from a snapshot plus the events after it is the view of the whole history.

It is folded chunk by chunk (never the whole history in memory) and its lists are bounded, so the
reply fits a send buffer whatever the session holds: the most frequent KEEP entities, the first KEEP
event types (later new types count as `other`), and the last KEEP transitions.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import Any

import pydantic_core

from memento_sessions.sessions.models import STATE_OF_TYPE

KEEP = 1000  # entities, types and transitions a condensed view lists
TRACK = 10 * KEEP  # distinct entities (and actors) counted before new ones are only tallied
SNAPSHOT_VERSION = 1  # bump when the folded state's shape changes; older snapshots are then refused


def transitions_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every change of working/broken state, in seq order, with the event that made it."""
    state, out = "working", []
    for event in events:
        new = new_state(event)
        if new and new != state:
            out.append({"seq": event["seq"], "from": state, "to": new, "actor": event.get("actor")})
            state = new
    return out


def new_state(event: dict[str, Any]) -> str | None:
    """The state a stored event sets: its stateTransition.to, else broken for `broke`, working for `test_pass`."""
    transition = event.get("stateTransition")
    if transition:
        to: str = transition["to"]
        return to
    return STATE_OF_TYPE.get(event.get("type", ""))


STATE_KEY = '"stateTransition"'
# How a stored event of a type in STATE_OF_TYPE reads: the Function stores `"type":"<type>"` exactly so
# (sessions/manager.event_body). A false match (the text inside `data`) only costs a decode. (A third type
# in STATE_OF_TYPE fails this unpacking at import: state_after must then test it too.)
BROKE, PASSED = (f'"type":"{kind}"' for kind in STATE_OF_TYPE)


def state_after(members: list[str], state: str) -> str:
    """The state right after the last of these stored events (in seq order), `state` before the first.

    The newest event that sets a state decides, so they are read newest first, and only those that may
    set one are decoded: a fork of 10,000 events decodes a handful, not all (it used to fold them all).
    The test is three substring searches, written out: a generator per event cost twice as much.
    """
    for member in reversed(members):
        if STATE_KEY in member or BROKE in member or PASSED in member:
            new = new_state(pydantic_core.from_json(member))
            if new:
                return new
    return state


class Condenser:
    """Folds events in seq order into counts, entities, transitions, actors and the perfDelta sum."""

    def __init__(self, state: str = "working") -> None:
        self.counts: Counter[str] = Counter()
        self.entities: Counter[str] = Counter()
        self.untracked = 0  # entity mentions past TRACK distinct ids
        self.transitions: deque[dict[str, Any]] = deque(maxlen=KEEP)
        self.transition_count = 0
        self.state = state
        self.perf_sum = 0.0
        self.actors: dict[str, int] = {}  # actor -> seq of its first event, in order of appearance
        self.seq = 0  # the last event folded
        self.events = 0  # events folded

    def add(self, events: list[dict[str, Any]]) -> None:
        """Fold the next events (seq order).

        The hot loop of time travel (up to a thousand events per `session.get {atSeq}`): what every event
        needs is bound to locals, and only events that may change the state go through new_state.
        """
        counts, actors, perf = self.counts, self.actors, self.perf_sum
        for event in events:
            kind = event["type"]
            counts[kind if kind in counts or len(counts) < KEEP else "other"] += 1
            change = event.get("changeInfo")
            if change:
                self._entities(change.get("entityIds") or [])
            impact = event.get("impact")
            if impact:
                perf += impact.get("perfDelta") or 0.0
            actor = event.get("actor")
            if actor and actor not in actors and len(actors) < TRACK:
                actors[actor] = event["seq"]
            if "stateTransition" in event or kind in STATE_OF_TYPE:
                self._transition(event)
        self.perf_sum = perf
        if events:
            self.seq = events[-1]["seq"]
            self.events += len(events)

    def _transition(self, event: dict[str, Any]) -> None:
        new = new_state(event)
        if new and new != self.state:
            self.transitions.append({"seq": event["seq"], "from": self.state, "to": new, "actor": event.get("actor")})
            self.transition_count += 1
            self.state = new

    def _entities(self, ids: list[str]) -> None:
        for entity in ids:
            if entity in self.entities or len(self.entities) < TRACK:
                self.entities[entity] += 1
            else:
                self.untracked += 1

    def result(self) -> dict[str, Any]:
        """The condensed view; `truncated` names the lists that were cut."""
        truncated = [name for name, cut in (("counts", "other" in self.counts and len(self.counts) >= KEEP),
                                            ("entities", len(self.entities) > KEEP or self.untracked > 0),
                                            ("transitions", self.transition_count > KEEP)) if cut]
        view: dict[str, Any] = {
            "counts": dict(self.counts), "entities": dict(self.entities.most_common(KEEP)),
            "transitions": list(self.transitions), "perfDelta": self.perf_sum if math.isfinite(self.perf_sum) else None,
        }
        if truncated:
            view["truncated"] = truncated
        return view

    def dump(self) -> dict[str, Any]:
        """The whole folded state as JSON-able data: a snapshot that `load` turns back into this Condenser."""
        return {"v": SNAPSHOT_VERSION, "seq": self.seq, "events": self.events, "state": self.state,
                "counts": dict(self.counts), "entities": dict(self.entities), "untracked": self.untracked,
                "transitions": list(self.transitions), "transitionCount": self.transition_count,
                "perfSum": self.perf_sum, "actors": self.actors}

    @classmethod
    def load(cls, data: dict[str, Any]) -> Condenser:
        """A Condenser in the state `dump` saved; folding the events after it continues exactly there."""
        if data.get("v") != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version {data.get('v')!r}; this daemon reads {SNAPSHOT_VERSION}")
        folder = cls(data["state"])
        folder.seq, folder.events, folder.untracked = data["seq"], data["events"], data["untracked"]
        folder.counts.update(data["counts"])
        folder.entities.update(data["entities"])
        folder.transitions.extend(data["transitions"])
        folder.transition_count, folder.perf_sum = data["transitionCount"], data["perfSum"]
        folder.actors = dict(data["actors"])
        return folder


def condense(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by type, entities with counts, transitions and the perfDelta sum."""
    folder = Condenser()
    folder.add(events)
    return folder.result()
