"""The summary of a checkpoint window: a pure function of the window's events and the session state.

Events are the wire dicts of the event model (camelCase, sessions/models.py), as stored in the session's ZSET.
Optional objects may be absent or null; both read as empty. A window naming more distinct entities than
the checkpoint's cap keeps the first `max_entities` of them in id order (the same on every daemon) and
counts the rest in `entities_skipped`: what a checkpoint writes to the graph, stores and returns is bounded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

KEY_SEVERITIES = frozenset({"high", "critical"})


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
    seqs = [int(event["seq"]) for event in events if "seq" in event]
    entities = sorted({entity for event in events for entity in _entity_ids(event)})
    kept = len(entities) if max_entities is None else min(len(entities), max_entities)
    impacts = _unique(impact for event in events for impact in _key_impacts(event))
    return Summary(
        outcome=state,
        broke_during=any(_breaks(event) for event in events),
        key_impacts=impacts if max_entities is None else impacts[:max_entities],
        perf_delta=float(sum(_perf_delta(event) for event in events)),
        actors=tuple(sorted({str(event["actor"]) for event in events if event.get("actor")})),
        entity_ids=tuple(entities[:kept]),
        from_seq=min(seqs, default=0),
        to_seq=max(seqs, default=0),
        entities_skipped=len(entities) - kept,
    )


def _part(event: dict[str, Any], name: str) -> dict[str, Any]:
    value = event.get(name)
    return value if isinstance(value, dict) else {}


def _entity_ids(event: dict[str, Any]) -> list[str]:
    return [str(entity) for entity in _part(event, "changeInfo").get("entityIds") or []]


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


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    """Items without repeats, in order of first appearance (the window's seq order)."""
    return tuple(dict.fromkeys(items))
