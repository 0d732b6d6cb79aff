"""Reading a session Postgres holds: suspended, completed (once Redis let it go), or archived.

`session.get` (with `since`/`limit` paging, `condensed`, `atSeq`) answers from the stored row the way it
answers from Redis, with the row's `status` in the session object and, as `expiresAt`, when its events go:
MEMENTO_ARCHIVE_AFTER_DAYS after it was suspended or completed (for an archived one, that time has passed).
An archived session has no events any more: its reply carries the summary it kept instead.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pydantic_core

from memento_sessions.errors import Conflict, Reason
from memento_sessions.history.views import at_result, beyond, compacted
from memento_sessions.lifecycle.postgres import LIVE_STATUSES, Suspended, SuspendedStore
from memento_sessions.sessions.condense import Condenser
from memento_sessions.sessions.conversation import ConversationFold
from memento_sessions.sessions.manager import iso, session_view
from memento_sessions.sessions.paging import Page
from memento_sessions.sessions.snapshots import Snapshot


def stored_session(session_id: str, status: str, fields: dict[str, str], agents: list[str], stored_at: datetime,
                   retention: timedelta) -> dict[str, Any]:
    """The session object of a stored session: as Redis would show it, with its status, when it left Redis,
    and when its events go (`retention` after that)."""
    view = session_view(session_id, fields, agents, 0)
    left = "completedAt" if fields["state"] == "completed" else "suspendedAt"
    shown = "suspended" if status in LIVE_STATUSES else status  # a row caught mid-move is still suspended
    return {**view, "status": shown, "expiresAt": iso(int((stored_at + retention).timestamp() * 1000)),
            left: stored_at.isoformat()}


def row_session(row: Suspended, retention: timedelta) -> dict[str, Any]:
    """The session object of a stored row."""
    return stored_session(row.session_id, row.status, row.fields, row.agents, row.suspended_at, retention)


async def snapshot_of(store: SuspendedStore, row: Suspended, at_seq: int) -> Snapshot | None:
    """The row's newest compaction snapshot at or before `at_seq`."""
    found = await store.snapshot_at(row, at_seq)
    return Snapshot(found[0], pydantic_core.from_json(found[1])) if found else None


async def stored_get(store: SuspendedStore, row: Suspended, retention: timedelta, since: int, limit: int,
                     budget: int) -> dict[str, Any]:
    """`session.get` of a stored session: a page of its events after `since` and `nextSince` when more exist;
    only the chunks the page needs are read."""
    page = Page(limit, budget)
    if not row.archived:
        async for members in store.events(row, since):
            if not all(page.add(member) for member in members):
                break
    events = [pydantic_core.from_json(member) for member in page.items]
    session = row_session(row, retention)
    result: dict[str, Any] = {"session": session, "events": events}
    if since < session.get("compactedSeq", 0) and not row.archived:
        snap = await snapshot_of(store, row, session["compactedSeq"])
        result["snapshot"] = snap.wire() if snap else None
    if row.archived:
        result["summary"] = row.summary  # archived: the events are gone, what they amounted to is kept
    if page.more:
        result["nextSince"] = events[-1]["seq"]
    return result


async def stored_condensed(store: SuspendedStore, row: Suspended, retention: timedelta) -> dict[str, Any]:
    """`session.get {condensed}` of a stored session: the summary its row keeps and, while it still holds
    its events, the conversation they carry (folded a chunk at a time)."""
    conversation = ConversationFold()
    if not row.archived:
        async for members in store.events(row, 0):
            conversation.add([pydantic_core.from_json(member) for member in members])
    session = row_session(row, retention)
    return {"session": session, **row.summary, **conversation.condensed(), "lastCheckpoint": session["lastCheckpoint"]}


async def stored_at(store: SuspendedStore, row: Suspended, retention: timedelta, at_seq: int) -> dict[str, Any]:
    """`session.get {atSeq}` of a stored session: its snapshot at or before `at_seq` plus the events after."""
    if row.archived:
        raise Conflict("the session is archived: its events are gone", {"reason": Reason.ARCHIVED})
    if at_seq > row.seq:
        raise beyond("atSeq", at_seq, row.seq)
    snap = await snapshot_of(store, row, at_seq)
    folder = snap.condenser() if snap else Condenser()
    compacted_seq = int(row.fields.get("compactedSeq") or 0)
    if folder.seq < min(at_seq, compacted_seq):
        raise compacted(at_seq, compacted_seq)
    async for members in store.events(row, folder.seq, at_seq):
        folder.add([pydantic_core.from_json(member) for member in members])
    return at_result(row_session(row, retention), at_seq, folder)
