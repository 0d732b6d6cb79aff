"""The condensed view of a session: what happened, without every event.

It is folded chunk by chunk (never the whole history in memory) and its lists are bounded, so the
reply fits a send buffer whatever the session holds: the most frequent KEEP entities, the first KEEP
event types (later new types count as `other`), and the last KEEP transitions.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import Any

from memento_sessions.sessions.models import STATE_OF_TYPE

KEEP = 1000  # entities, types and transitions a condensed view lists
TRACK = 10 * KEEP  # distinct entities counted before new ones are only tallied


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


class Condenser:
    """Folds events in seq order into counts, entities, transitions and the perfDelta sum."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.entities: Counter[str] = Counter()
        self.untracked = 0  # entity mentions past TRACK distinct ids
        self.transitions: deque[dict[str, Any]] = deque(maxlen=KEEP)
        self.transition_count = 0
        self.state = "working"
        self.perf_sum = 0.0

    def add(self, events: list[dict[str, Any]]) -> None:
        """Fold the next events (seq order)."""
        for event in events:
            kind = event["type"]
            self.counts[kind if kind in self.counts or len(self.counts) < KEEP else "other"] += 1
            self._entities((event.get("changeInfo") or {}).get("entityIds") or [])
            self.perf_sum += (event.get("impact") or {}).get("perfDelta") or 0.0
            new = new_state(event)
            if new and new != self.state:
                self.transitions.append({"seq": event["seq"], "from": self.state, "to": new,
                                         "actor": event.get("actor")})
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


def condense(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by type, entities with counts, transitions and the perfDelta sum."""
    folder = Condenser()
    folder.add(events)
    return folder.result()
