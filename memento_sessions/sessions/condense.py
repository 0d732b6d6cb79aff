"""The condensed view of a session: what happened, without every event."""

from __future__ import annotations

from collections import Counter
from typing import Any

from memento_sessions.sessions.models import STATE_OF_TYPE


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


def condense(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by type, entities with counts, transitions and the perfDelta sum."""
    counts = Counter(event["type"] for event in events)
    entities: Counter[str] = Counter()
    perf = 0.0
    for event in events:
        entities.update((event.get("changeInfo") or {}).get("entityIds") or [])
        perf += (event.get("impact") or {}).get("perfDelta") or 0.0
    return {"counts": dict(counts), "entities": dict(entities.most_common()),
            "transitions": transitions_of(events), "perfDelta": perf}
