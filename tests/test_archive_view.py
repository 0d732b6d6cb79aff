"""bridge/archive.py: an expired session's view as its anchors and failure snapshot rebuild it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from memento_sessions.bridge.archive import archived_view
from memento_sessions.checkpoints.snapshots import Snapshot


def snapshot(outcome: str, events: list[dict[str, Any]]) -> Snapshot:
    return Snapshot(1, "s1", "cp/1", "ns", outcome, events, datetime.now(UTC))


def test_the_newest_anchor_gives_the_state_and_every_actor_and_seq_counts() -> None:
    anchors = [{"outcome": "broken", "actors": ["alice"], "toSeq": 4}, {"outcome": "working", "toSeq": 9}]
    events: list[dict[str, Any]] = [{"seq": 3, "actor": "bob"}, {"seq": 4}]
    assert archived_view("s1", anchors, snapshot("broken", events), events) == {
        "sessionId": "s1", "state": "working", "agentIds": ["alice", "bob"], "seq": 9}


def test_without_anchors_the_snapshot_gives_the_state_and_its_events_the_seq() -> None:
    events: list[dict[str, Any]] = [{"seq": 7, "actor": "carol"}, {"actor": "dave"}]
    assert archived_view("s1", [], snapshot("broken", events), events) == {
        "sessionId": "s1", "state": "broken", "agentIds": ["carol", "dave"], "seq": 7}
    assert archived_view("s1", [], None, []) == {"sessionId": "s1", "state": None, "agentIds": [], "seq": 0}
