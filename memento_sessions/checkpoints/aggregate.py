"""The summary of a checkpoint window: a pure function of the window's events and the session state.

Events are the wire dicts of the event model (camelCase, sessions/models.py), as stored in the session's ZSET.
Optional objects may be absent or null; both read as empty. A window naming more distinct entities than
the checkpoint's cap keeps the first `max_entities` of them in id order (the same on every daemon) and
counts the rest in `entities_skipped`: what a checkpoint writes to the graph, stores and returns is bounded.
Those first ids are selected, not found by sorting all of them: a window of 100,000 new ids costs about
one pass over them, not a sort.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from itertools import islice
from typing import Any

KEY_SEVERITIES = frozenset({"high", "critical"})
SELECT_BATCH = 8192  # ids compared against the kept ones' largest per step of `smallest`
REMEMBERED_PER_KEPT = 64  # distinct ids a window's tally remembers per id it may keep (131,072 at the default cap)


@dataclass(frozen=True, slots=True)
class Summary:
    """The outcome of one checkpoint window."""

    outcome: str
    broke_during: bool
    key_impacts: tuple[str, ...]
    perf_delta: float
    actors: tuple[str, ...]
    entity_ids: tuple[str, ...]
    from_seq: int
    to_seq: int
    entities_skipped: int = 0

    def to_wire(self) -> dict[str, Any]:
        """The camelCase fields of the `session.checkpoint` result."""
        return {
            "outcome": self.outcome, "brokeDuring": self.broke_during, "keyImpacts": list(self.key_impacts),
            "perfDelta": self.perf_delta, "actors": list(self.actors), "entityIds": list(self.entity_ids),
            "fromSeq": self.from_seq, "toSeq": self.to_seq,
        }


def aggregate(events: list[dict[str, Any]], state: str, max_entities: int | None = None) -> Summary:
    """Summarise the window `events`; `state` is the session state at the checkpoint (the outcome).

    At most `max_entities` entity ids (and key impacts) are kept; the entities past it are counted.
    """
    tally = Tally(max_entities)
    tally.add(events)
    return tally.summary(state)


class Tally:
    """A window's summary built a part at a time (`add` each part in seq order, then `summary`), the same as
    `aggregate` of the whole: a caller can let others run between the parts of a large window. What it holds
    is bounded by `max_entities`: the ids it keeps, and at most REMEMBERED_PER_KEPT times as many distinct
    ids it has seen (a window may name a session's every id, 1.28 million of them). Past that many, an id
    that is neither remembered nor kept is counted each time a part names it anew, so `entities_skipped` is
    exact up to that many distinct ids and an upper bound beyond; which ids are remembered depends only on
    the window, so every daemon counts the same."""

    def __init__(self, max_entities: int | None = None) -> None:
        self.cap = max_entities
        self.seen: set[str] = set()
        self.forgotten = 0  # ids counted but not remembered, past the bound
        self.kept: list[str] = []
        self.impacts: dict[str, None] = {}
        self.actors: set[str] = set()
        self.perf_delta, self.broke = 0.0, False
        self.seqs: tuple[int, int] | None = None

    def add(self, events: list[dict[str, Any]]) -> int:
        """The next part of the window; how many entity ids it names."""
        for event in events:
            if "seq" in event:
                seq = int(event["seq"])
                self.seqs = (seq, seq) if self.seqs is None else (min(self.seqs[0], seq), max(self.seqs[1], seq))
            if event.get("actor"):
                self.actors.add(str(event["actor"]))
            self.broke = self.broke or _breaks(event)
            self.perf_delta += _perf_delta(event)
            for impact in _key_impacts(event):
                if self.cap is None or len(self.impacts) < self.cap:
                    self.impacts.setdefault(impact)
        named, new = 0, set()
        for event in events:  # the ids gathered by set.update and map(str), in C
            ids = _entity_ids(event)
            named += len(ids)
            new.update(ids)
        new -= self.seen
        if self.forgotten:
            new.difference_update(self.kept)  # a kept id not remembered is still never counted twice
        self.kept = [*self.kept, *new] if self.cap is None else smallest([*self.kept, *new], self.cap)
        room = len(new) if self.cap is None else self.cap * REMEMBERED_PER_KEPT - len(self.seen)
        if len(new) > room:
            # The smallest of the part's new ids while there is room. One that did not make the kept ids
            # never will (they only get smaller), so forgetting it can only count it again.
            remembered = set(sorted(new)[:max(room, 0)])
            self.forgotten += len(new) - len(remembered)
            new = remembered
        self.seen |= new
        return named

    def summary(self, state: str) -> Summary:
        """The summary of every part added; `state` is the outcome."""
        return Summary(
            outcome=state,
            broke_during=self.broke,
            key_impacts=tuple(self.impacts),
            perf_delta=self.perf_delta,
            actors=tuple(sorted(self.actors)),
            entity_ids=tuple(sorted(self.kept)),
            from_seq=self.seqs[0] if self.seqs else 0,
            to_seq=self.seqs[1] if self.seqs else 0,
            entities_skipped=len(self.seen) + self.forgotten - len(self.kept),
        )


def smallest(items: Collection[str], count: int) -> list[str]:
    """The `count` smallest of `items` in order: `sorted(items)[:count]`, in one pass for a small count.

    Each batch is compared with the largest kept id; only those below it are merged in (a sort of the kept
    ones and those few), so the cost is about n comparisons, not a sort of all n.
    """
    found = iter(items)
    kept = sorted(islice(found, max(count, 0)))
    while kept and len(kept) == count and (batch := list(islice(found, SELECT_BATCH))):
        top = kept[-1]
        below = [item for item in batch if item < top]
        if below:
            kept = sorted(kept + below)[:count]
    return kept


def _part(event: dict[str, Any], name: str) -> dict[str, Any]:
    value = event.get(name)
    return value if isinstance(value, dict) else {}


def _entity_ids(event: dict[str, Any]) -> list[str]:
    return list(map(str, _part(event, "changeInfo").get("entityIds") or []))


def _breaks(event: dict[str, Any]) -> bool:
    return event.get("type") == "broke" or _part(event, "stateTransition").get("to") == "broken"


def _perf_delta(event: dict[str, Any]) -> float:
    value = _part(event, "impact").get("perfDelta")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _key_impacts(event: dict[str, Any]) -> list[str]:
    """`<entityId>:<severity>` per entity of a high/critical impact; `<type>:<severity>` when it names none."""
    severity = _part(event, "impact").get("severity")
    if severity not in KEY_SEVERITIES:
        return []
    targets = _entity_ids(event) or [str(event.get("type", "event"))]
    return [f"{target}:{severity}" for target in targets]
