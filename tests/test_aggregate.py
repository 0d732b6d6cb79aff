"""The checkpoint summary, computed from a window of wire events."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from memento_sessions.checkpoints.aggregate import REMEMBERED_PER_KEPT, Summary, Tally, aggregate, smallest


def event(seq: int, type_: str = "modified", actor: str = "agent-a", entities: list[str] | None = None,
          **parts: Any) -> dict[str, Any]:
    """A stored event as the ZSET holds it."""
    body: dict[str, Any] = {"seq": seq, "type": type_, "actor": actor, "sessionId": "s-1"}
    if entities is not None:
        body["changeInfo"] = {"entityIds": entities, "operation": "modified"}
    body.update(parts)
    return body


def test_broken_then_fixed_in_one_window_is_working_but_broke_during() -> None:
    window = [
        event(11, entities=["svc.auth.login"]),
        event(12, "broke", actor="agent-b", entities=["svc.auth.login"],
              impact={"severity": "high", "testsFailed": ["t-login"], "perfDelta": 12.5}),
        event(13, "test_pass", stateTransition={"from": "broken", "to": "working", "verifiedBy": "test"},
              impact={"perfDelta": -2.0}),
    ]
    summary = aggregate(window, "working")
    assert summary == Summary(
        outcome="working", broke_during=True, key_impacts=("svc.auth.login:high",), perf_delta=10.5,
        actors=("agent-a", "agent-b"), entity_ids=("svc.auth.login",), from_seq=11, to_seq=13,
    )


def test_state_transition_to_broken_counts_as_breaking() -> None:
    window = [event(1, "modified", stateTransition={"to": "broken"})]
    assert aggregate(window, "broken").broke_during is True
    assert aggregate([event(1, stateTransition={"to": "working"})], "working").broke_during is False


def test_key_impacts_keep_high_and_critical_once_each_in_window_order() -> None:
    window = [
        event(1, entities=["b", "a"], impact={"severity": "critical"}),
        event(2, entities=["c"], impact={"severity": "medium"}),
        event(3, entities=["a"], impact={"severity": "low"}),
        event(4, "deploy", impact={"severity": "high"}),
        event(5, entities=["b"], impact={"severity": "critical"}),
        event(6, entities=["a"], impact={"severity": "high"}),
    ]
    assert aggregate(window, "broken").key_impacts == ("b:critical", "a:critical", "deploy:high", "a:high")


def test_entities_and_actors_are_sorted_unique_and_perf_delta_sums() -> None:
    window = [
        event(7, actor="z-agent", entities=["m", "a"], impact={"perfDelta": 1.25}),
        event(8, actor="a-agent", entities=["m", "z"], impact={"perfDelta": 3}),
        event(9, actor="z-agent", impact={"perfDelta": None, "severity": None}),
        event(10, actor="z-agent", changeInfo=None, impact=None, stateTransition=None),
    ]
    summary = aggregate(window, "working")
    assert summary.entity_ids == ("a", "m", "z")
    assert summary.actors == ("a-agent", "z-agent")
    assert summary.perf_delta == 4.25
    assert (summary.from_seq, summary.to_seq) == (7, 10)
    assert summary.broke_during is False and summary.key_impacts == ()


def test_empty_window() -> None:
    summary = aggregate([], "coordinating")
    assert summary.to_wire() == {
        "outcome": "coordinating", "brokeDuring": False, "keyImpacts": [], "perfDelta": 0.0, "actors": [],
        "entityIds": [], "fromSeq": 0, "toSeq": 0,
    }


def test_wire_shape_is_camel_case_lists() -> None:
    wire = aggregate([event(3, entities=["x"], impact={"severity": "critical", "perfDelta": 2})], "broken").to_wire()
    assert wire == {
        "outcome": "broken", "brokeDuring": False, "keyImpacts": ["x:critical"], "perfDelta": 2.0,
        "actors": ["agent-a"], "entityIds": ["x"], "fromSeq": 3, "toSeq": 3,
    }


def sorted_summary(events: list[dict[str, Any]], state: str, cap: int) -> Summary:
    """The summary as it was computed before ids were selected: every distinct id sorted, then cut at `cap`."""
    entities = sorted({str(e) for event in events for e in (event.get("changeInfo") or {}).get("entityIds") or []})
    impacts = tuple(dict.fromkeys(f"{target}:{event['impact']['severity']}" for event in events
                                  if (event.get("impact") or {}).get("severity") in ("high", "critical")
                                  for target in ((event.get("changeInfo") or {}).get("entityIds")
                                                 or [event["type"]])))
    perf = float(sum(float(event.get("impact", {}).get("perfDelta", 0)) for event in events))
    return Summary(outcome=state, broke_during=any(event["type"] == "broke" for event in events),
                   key_impacts=impacts[:cap], perf_delta=perf,
                   actors=tuple(sorted({event["actor"] for event in events})), entity_ids=tuple(entities[:cap]),
                   from_seq=min(event["seq"] for event in events), to_seq=max(event["seq"] for event in events),
                   entities_skipped=max(0, len(entities) - cap))


def random_window(rng: random.Random, size: int) -> list[dict[str, Any]]:
    """`size` events naming random ids (some repeated), some of them high or critical, some broken."""
    window = []
    for seq in range(1, size + 1):
        ids = [f"e{rng.randrange(3000):04x}.{rng.choice('abc')}" for _ in range(rng.randrange(0, 40))]
        impact = {"severity": rng.choice(["low", "high", "critical"]), "perfDelta": rng.uniform(-5, 5)}
        window.append(event(seq, rng.choice(["modified", "modified", "broke"]), rng.choice(["a", "b", "c"]),
                            ids, impact=impact))
    return window


def test_selected_ids_are_the_sorted_ones_on_random_windows() -> None:
    """Selecting the first `cap` ids (with parts added one after the other) gives the summary sorting all gave;
    the count of the rest is exact while the tally remembers every distinct id, an upper bound past that."""
    rng = random.Random(28)
    for round_ in range(60):
        window = random_window(rng, rng.randrange(1, 120))
        cap = rng.choice([1, 7, 50, 300, 5000])
        expected = sorted_summary(window, "working", cap)
        distinct = expected.entities_skipped + len(expected.entity_ids)
        for summary, seen in [(aggregate(window, "working", cap), 0), parted(window, cap)]:
            if distinct <= cap * REMEMBERED_PER_KEPT:
                assert summary == expected, round_
            else:
                assert summary.entities_skipped >= expected.entities_skipped, round_
                assert replace(summary, entities_skipped=expected.entities_skipped) == expected, round_
                assert seen <= cap * REMEMBERED_PER_KEPT + cap, round_


def parted(window: list[dict[str, Any]], cap: int) -> tuple[Summary, int]:
    """The window's summary from parts of 9 events, and how many ids its tally remembered."""
    tally = Tally(cap)
    for start in range(0, len(window), 9):
        tally.add(window[start:start + 9])
    return tally.summary("working"), len(tally.seen)


def test_a_window_naming_more_ids_than_a_tally_remembers_keeps_the_smallest_and_counts_the_rest() -> None:
    """1,000 distinct ids named again and again, in shuffled parts, against a cap of 4 (256 remembered)."""
    rng = random.Random(7)
    ids = [f"id{n:04d}" for n in range(1000)]
    tally = Tally(4)
    for seq in range(1, 200):
        tally.add([event(seq, entities=rng.sample(ids, 40))])
    summary = tally.summary("working")
    named = {entity for entity in ids if entity in tally.seen} | set(summary.entity_ids)
    assert summary.entity_ids == tuple(sorted(named)[:4])
    assert len(tally.seen) <= 4 * REMEMBERED_PER_KEPT + 4
    assert summary.entities_skipped >= len(named) - 4


def test_smallest_is_the_head_of_the_sorted_ids() -> None:
    rng = random.Random(5)
    ids = {f"{rng.getrandbits(32):08x}" for _ in range(20_000)}
    for count in (0, 1, 2048, 19_999, 20_000, 30_000):
        assert smallest(ids, count) == sorted(ids)[:count]
