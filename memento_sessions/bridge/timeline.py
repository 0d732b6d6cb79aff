"""What a session's events say, without I/O: breakages, an agent's share, the entities touched."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import pydantic_core

from memento_sessions.sessions.condense import new_state

Event = dict[str, Any]
# The KG context of a breakage covers the entities changed last before it: the likeliest culprits, and a
# bound on the graph work (50 breakages of a 1,000-event session would otherwise ask about thousands).
SUSPECTS = 5


Found = str  # a Breakage as JSON text: `[fromSeq, toSeq, [window...], {"changeInfo", "impact"}]`


def found(from_seq: int, event: Event, window: tuple[str, ...]) -> Found:
    """A breakage as the fold keeps it: JSON text, which the collector never tracks or counts."""
    detail = {"changeInfo": event.get("changeInfo"), "impact": event.get("impact")}
    return pydantic_core.to_json([from_seq, int(event["seq"]), window, detail]).decode()


class Breakage(NamedTuple):
    """One working-to-broken transition and the entities changed last since the session last worked.

    The fold holds each as JSON text (`Found`), not as objects: the bridge's cache holds thousands, and
    every container object it holds counts toward the collector's next young-generation pass, which
    then walks them all (decoded events at first made every full collection slower; tuples of strings
    still triggered young passes of 10,000 objects; docs/bridge.md).
    """

    from_seq: int
    to_seq: int
    window: tuple[str, ...]
    detail: dict[str, Any]  # the breaking event's changeInfo and impact

    @classmethod
    def load(cls, text: Found) -> Breakage:
        """A held breakage, decoded."""
        from_seq, to_seq, window, detail = pydantic_core.from_json(text)
        return cls(from_seq, to_seq, tuple(window), detail)

    def view(self) -> dict[str, Any]:
        """The `{fromSeq, toSeq, changeInfo, impact}` of `bridge.transitions`' reply."""
        return {"fromSeq": self.from_seq, "toSeq": self.to_seq, **self.detail}


def entity_ids(event: Event) -> list[str]:
    """The entities an event changed (`changeInfo.entityIds`)."""
    ids: list[str] = (event.get("changeInfo") or {}).get("entityIds") or []
    return ids


def breakages(events: Iterable[Event], entity_id: str | None = None) -> list[Breakage]:
    """Every working-to-broken transition, in seq order, optionally only those whose window touched `entity_id`.

    `fromSeq` is the last event that showed the session working (`start`, `test_pass`, or a transition to
    working; 0 when none did), so the events after it up to `toSeq` are the suspects, and the window is
    the last SUSPECTS distinct entities they changed (a re-changed entity counts as changed last).
    """
    fold = BreakageFold(entity_id)
    fold.feed(events)
    return fold.breakages()


class BreakageFold:
    """`breakages` as a left fold over the events, so more events can be fed later (bridge/cache.py)."""

    __slots__ = ("entity_id", "found", "last_ok", "state", "window")

    def __init__(self, entity_id: str | None = None) -> None:
        self.entity_id = entity_id
        self.found: list[Found] = []
        self.state, self.last_ok, self.window = "working", 0, dict[str, None]()

    def feed(self, events: Iterable[Event]) -> None:
        """Advance over `events`, the next ones in seq order."""
        state, last_ok, window, seen, wanted = self.state, self.last_ok, self.window, self.found, self.entity_id
        for event in events:
            for entity in entity_ids(event):
                window.pop(entity, None)
                window[entity] = None
            if wanted is None:  # only the last SUSPECTS are ever reported: hold no more (bridge/cache.py)
                while len(window) > SUSPECTS:
                    del window[next(iter(window))]
            new = new_state(event)
            if new == "broken" and state == "working" and (wanted is None or wanted in window):
                seen.append(found(last_ok, event, tuple(window)[-SUSPECTS:]))
            state = new or state
            if state == "working" and (new == "working" or event.get("type") == "start"):
                last_ok, window = int(event["seq"]), {}
        self.state, self.last_ok, self.window = state, last_ok, window

    def breakages(self) -> list[Breakage]:
        """Every breakage found so far, in seq order."""
        return [Breakage.load(item) for item in self.found]


def by_actor(events: Iterable[Event], agent_id: str) -> list[Event]:
    """The events an agent emitted."""
    return [event for event in events if event.get("actor") == agent_id]


def touched(events: Iterable[Event]) -> list[str]:
    """Every entity the events changed, in order of first change."""
    seen: dict[str, None] = {}
    for event in events:
        seen.update(dict.fromkeys(entity_ids(event)))
    return list(seen)


def perf_sum(events: Iterable[Event]) -> float:
    """The sum of `impact.perfDelta` over the events."""
    return float(sum((event.get("impact") or {}).get("perfDelta") or 0.0 for event in events))


def last_break(events: Sequence[Event]) -> Event | None:
    """The latest event among `events` that set the state to broken, unless a later one set it working."""
    for event in reversed(events):
        state = new_state(event)
        if state == "working":
            return None
        if state == "broken":
            return event
    return None
