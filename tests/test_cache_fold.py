"""bridge/cache.py folds fetched events apart from fetching them: `fold` alone, on stored-event JSON."""

from __future__ import annotations

import json

import pytest

from memento_sessions.bridge import cache
from memento_sessions.bridge.cache import Entry, fold

pytestmark = pytest.mark.anyio


def member(seq: int, kind: str, *entities: str) -> str:
    return json.dumps({"seq": seq, "type": kind, "changeInfo": {"entityIds": list(entities)}})


async def test_fold_hands_each_chunks_new_windows_to_the_hint_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "CHUNK", 2)
    members = [member(1, "modified", "fn:a"), member(2, "broke", "fn:b"), member(3, "test_pass"),
               member(4, "modified", "fn:c"), member(5, "broke", "fn:d")]
    entry, told = Entry("e1"), list[list[tuple[str, ...]]]()

    def hint(windows: list[tuple[str, ...]]) -> bool:
        told.append(windows)
        return False

    await fold(entry, members, hint)
    assert told == [[("fn:a", "fn:b")], [], [("fn:c", "fn:d")]]
    assert entry.last_seq == 5
    assert [(b.from_seq, b.to_seq) for b in entry.fold.breakages()] == [(0, 2), (3, 5)]


async def test_fold_skips_events_already_folded_and_needs_no_hint() -> None:
    entry = Entry("e1")
    await fold(entry, [member(1, "broke", "fn:a")], None)
    await fold(entry, [member(1, "broke", "fn:a"), member(2, "modified", "fn:b")], None)
    assert (entry.last_seq, len(entry.fold.found)) == (2, 1)
