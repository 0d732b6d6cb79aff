"""Reading a session Postgres holds: suspended, completed (once Redis let it go), or archived.

`session.get` (with `since`/`limit` paging, `condensed`, `atSeq`) answers from the stored row the way it
answers from Redis, with the row's `status` in the session object and, as `expiresAt`, when its events go:
MEMENTO_ARCHIVE_AFTER_DAYS after it was suspended or completed (for an archived one, that time has passed).
An archived session has no events any more: its reply carries the summary it kept instead.
"""

from __future__ import annotations

import bisect
from datetime import datetime, timedelta
from typing import Any

import pydantic_core

from memento_sessions.errors import Conflict
from memento_sessions.sessions.condense import Condenser
from memento_sessions.sessions.conversation import ConversationFold
from memento_sessions.sessions.history import at_result, beyond, compacted
from memento_sessions.sessions.manager import iso, session_view
from memento_sessions.sessions.paging import Page, seq_of
from memento_sessions.sessions.snapshot_store import SNAPSHOT_LIST, SNAPSHOT_PREFIX, Snapshot
from memento_sessions.sessions.suspended import Suspended


def stored_session(session_id: str, status: str, fields: dict[str, str], agents: list[str], stored_at: datetime,
                   retention: timedelta) -> dict[str, Any]:
    """The session object of a stored session: as Redis would show it, with its status, when it left Redis,
    and when its events go (`retention` after that)."""
    view = session_view(session_id, fields, agents, 0)
    left = "completedAt" if fields["state"] == "completed" else "suspendedAt"
    return {**view, "status": status, "expiresAt": iso(int((stored_at + retention).timestamp() * 1000)),
            left: stored_at.isoformat()}


def row_session(row: Suspended, retention: timedelta) -> dict[str, Any]:
    """The session object of a stored row."""
    return stored_session(row.session_id, row.status, row.fields, row.agents, row.suspended_at, retention)


def snapshot_of(row: Suspended, at_seq: int) -> Snapshot | None:
    """The row's newest compaction snapshot at or before `at_seq`."""
    seqs = [int(s) for s in (row.ids.get(SNAPSHOT_LIST) or "").split() if int(s) <= at_seq]
    if not seqs:
        return None
    return Snapshot(max(seqs), pydantic_core.from_json(row.ids[f"{SNAPSHOT_PREFIX}{max(seqs)}"]))


def members_between(members: list[str], after: int, upto: int | None = None) -> list[str]:
    """The stored members with `after` < seq (<= `upto`); members are in seq order, so two bisections."""
    lo = bisect.bisect_right(members, after, key=seq_of)
    hi = len(members) if upto is None else bisect.bisect_right(members, upto, key=seq_of)
    return members[lo:hi]


def stored_get(row: Suspended, retention: timedelta, since: int, limit: int, budget: int) -> dict[str, Any]:
    """`session.get` of a stored session: a page of its events after `since` and `nextSince` when more exist."""
    page = Page(limit, budget)
    for member in members_between(row.events or [], since):
        if not page.add(member):
            break
    events = [pydantic_core.from_json(member) for member in page.items]
    session = row_session(row, retention)
    result: dict[str, Any] = {"session": session, "events": events}
    if since < session.get("compactedSeq", 0) and row.events is not None:
        snap = snapshot_of(row, session["compactedSeq"])
        result["snapshot"] = snap.wire() if snap else None
    if row.events is None:
        result["summary"] = row.summary  # archived: the events are gone, what they amounted to is kept
    if page.more:
        result["nextSince"] = events[-1]["seq"]
    return result


def stored_condensed(row: Suspended, retention: timedelta) -> dict[str, Any]:
    """`session.get {condensed}` of a stored session: the summary its row keeps and, while it still holds
    its events, the conversation they carry."""
    conversation = ConversationFold()
    conversation.add([pydantic_core.from_json(member) for member in row.events or []])
    session = row_session(row, retention)
    return {"session": session, **row.summary, **conversation.condensed(), "lastCheckpoint": session["lastCheckpoint"]}


def stored_at(row: Suspended, retention: timedelta, at_seq: int) -> dict[str, Any]:
    """`session.get {atSeq}` of a stored session: its snapshot at or before `at_seq` plus the events after."""
    if row.events is None:
        raise Conflict("the session is archived: its events are gone", {"reason": "archived"})
    if at_seq > row.seq:
        raise beyond("atSeq", at_seq, row.seq)
    snap = snapshot_of(row, at_seq)
    folder = snap.condenser() if snap else Condenser()
    compacted_seq = int(row.fields.get("compactedSeq") or 0)
    if folder.seq < min(at_seq, compacted_seq):
        raise compacted(at_seq, compacted_seq)
    folder.add([pydantic_core.from_json(member) for member in members_between(row.events, folder.seq, at_seq)])
    return at_result(row_session(row, retention), at_seq, folder)
