"""Event sourcing over a session: time travel, diff, snapshots and compaction.

Every view here is folded by the session's one reducer (`condense.Condenser`): rehydration is the
newest snapshot at or before the wanted seq plus the events after it, and it equals the view folded
from the whole history (tests/test_compaction.py checks that at every seq of random sessions).
Seqs are contiguous (the Function assigns them one by one and only compaction removes events), so a
fold that did not see every seq it expected knows the history moved under it and says so.
"""

from __future__ import annotations

import time
from typing import Any

import pydantic_core
from redis.exceptions import ResponseError

from memento_sessions import keys
from memento_sessions.errors import Conflict, InvalidParams, NotFound, Reason
from memento_sessions.metrics import COMPACTIONS, REHYDRATE_SECONDS
from memento_sessions.rpc import encode_notification
from memento_sessions.sessions.condense import KEEP, Condenser
from memento_sessions.sessions.manager import VIEW_READS, FullHandler, SessionManager, ask_view, iso, now_ms, view_of
from memento_sessions.sessions.snapshots import SNAPSHOT_LIST, SNAPSHOT_PREFIX, snapshot_id

FOLD_CHUNK = 1000  # events read per round trip while folding
MAX_SNAPSHOTS = 256  # snapshots kept per session (the oldest go first, never the compaction base)


def beyond(field: str, value: int, seq: int) -> InvalidParams:
    """-32602 for a seq past the session's current seq."""
    return InvalidParams("invalid params", [{"field": field, "message": f"{value} is beyond the session's seq {seq}"}])


def compacted(seq: int, compacted_seq: int) -> Conflict:
    """-32009 `compacted`: the events needed were removed by compaction and no snapshot sits at `seq`."""
    return Conflict(f"events up to {compacted_seq} were compacted; no snapshot at seq {seq}",
                    {"reason": Reason.COMPACTED, "compactedSeq": compacted_seq})


def compaction_limit(view: dict[str, Any], postgres: bool) -> int:
    """The highest seq compaction may remove up to without starving a checkpoint.

    The next checkpoint aggregates the events after the last checkpoint's seq, so those stay. A broken
    session's next failure snapshot stores the events after `snapshotSeq` (what earlier snapshots hold):
    while a broken snapshot may still need them, they stay too.
    """
    last = view.get("lastCheckpoint") or {}
    cap = int(last.get("seq", 0))
    if postgres and view["state"] == "broken":
        cap = min(cap, int(last.get("snapshotSeq", 0)))
    return cap


def at_result(session: dict[str, Any], at_seq: int, folder: Condenser) -> dict[str, Any]:
    """The reply of `session.get {atSeq}` from the session's view and the reducer folded up to `at_seq`."""
    at_view = {**session, "seq": at_seq, "state": folder.state, "agentIds": sorted(folder.actors)}
    return {"session": at_view, "atSeq": at_seq, "events": folder.events, **folder.result(),
            "lastCheckpoint": session["lastCheckpoint"]}


class History:
    """Rehydration, time travel, diff, snapshots and compaction over one SessionManager."""

    def __init__(self, manager: SessionManager, postgres: bool = True) -> None:
        self.manager, self.store, self.redis = manager, manager.store, manager.redis
        self.settings = manager.settings
        self.postgres = postgres

    async def fold(self, namespace: str, session_id: str, at_seq: int) -> tuple[dict[str, Any], Condenser]:
        """The session view and the reducer's state right after event `at_seq` (snapshot + events after)."""
        session, folder, _ = await self.fold_from(namespace, session_id, at_seq)
        return session, folder

    async def fold_from(self, namespace: str, session_id: str, at_seq: int) -> tuple[dict[str, Any], Condenser, int]:
        """As `fold`, with the seq of the snapshot the fold started from (0: from the first event).

        Two round trips, each one MULTI on the session's slot: the view with the list of snapshot seqs,
        then the snapshot to start from with the first events after it (more chunks only past FOLD_CHUNK).
        """
        skeys = keys.session_keys(namespace, session_id)
        for _ in range(3):  # a compaction that lands mid-fold makes the fold retry from the new snapshot
            async with self.redis.pipeline(transaction=True) as pipe:
                ask_view(pipe, skeys)
                pipe.hget(skeys.ids, SNAPSHOT_LIST)
                replies = await pipe.execute()
            session = view_of(session_id, replies[:VIEW_READS])
            if session is None:
                raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})
            if at_seq > session["seq"]:
                raise beyond("atSeq", at_seq, session["seq"])
            base = max((seq for seq in map(int, (replies[VIEW_READS] or "").split()) if seq <= at_seq), default=0)
            folded = await self._fold(skeys, base, at_seq, session.get("compactedSeq", 0))
            if folded is not None:
                return session, folded, base
        raise Conflict("the session was compacted while it was read; try again", {"reason": Reason.BUSY})

    async def _fold(self, skeys: keys.SessionKeys, base: int, at_seq: int, compacted_seq: int) -> Condenser | None:
        """The reducer from the snapshot at `base` (0: none) through `at_seq`; None when the history moved
        under the read (the snapshot was dropped, or events were compacted away meanwhile)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(skeys.ids, f"{SNAPSHOT_PREFIX}{base}")
            pipe.zrangebyscore(skeys.events, f"({base}", at_seq, start=0, num=FOLD_CHUNK)
            data, members = await pipe.execute()
        if base and data is None:
            return None
        folder = Condenser.load(pydantic_core.from_json(data)) if base else Condenser()
        if folder.seq < min(at_seq, compacted_seq):
            raise compacted(at_seq, compacted_seq)
        before = folder.events
        while members:
            folder.add([pydantic_core.from_json(member) for member in members])
            if folder.seq >= at_seq or len(members) < FOLD_CHUNK:
                break
            members = await self.redis.zrangebyscore(skeys.events, f"({folder.seq}", at_seq, start=0, num=FOLD_CHUNK)
        if folder.seq != at_seq or folder.events - before != at_seq - base:
            return None  # events went missing under the fold: compacted meanwhile
        return folder

    async def get_at(self, namespace: str, session_id: str, at_seq: int) -> dict[str, Any]:
        """`session.get {atSeq}`: the session as it was right after event `at_seq`."""
        started = time.perf_counter()
        session, folder = await self.fold(namespace, session_id, at_seq)
        REHYDRATE_SECONDS.observe(time.perf_counter() - started)
        return at_result(session, at_seq, folder)

    async def diff(self, namespace: str, session_id: str, from_seq: int, to_seq: int) -> dict[str, Any]:
        """`session.diff`: what changed between right after `from_seq` and right after `to_seq`."""
        if from_seq > to_seq:
            raise InvalidParams("invalid params", [{"field": "fromSeq", "message": f"{from_seq} is after "
                                                    f"toSeq {to_seq}"}])
        session, start = await self.fold(namespace, session_id, from_seq)
        if to_seq > session["seq"]:
            raise beyond("toSeq", to_seq, session["seq"])
        window = Condenser(start.state)
        window.seq = from_seq
        events_key = keys.session_keys(namespace, session_id).events
        while window.seq < to_seq:
            members: list[Any] = await self.redis.zrangebyscore(events_key, f"({window.seq}", to_seq, start=0,
                                                                num=FOLD_CHUNK)
            if not members:
                break
            window.add([pydantic_core.from_json(member) for member in members])
        if window.events != to_seq - from_seq:
            raise compacted(from_seq, from_seq)
        view = window.result()
        return {"fromSeq": from_seq, "toSeq": to_seq, "stateFrom": start.state, "stateTo": window.state,
                "events": window.events, "byType": view["counts"], "entitiesChanged": sorted(view["entities"])[:KEEP],
                "agentsJoined": [agent for agent in window.actors if agent not in start.actors],
                "agentsLeft": [], "transitions": view["transitions"], "perfDelta": view["perfDelta"]}

    async def snapshot(self, namespace: str, session_id: str) -> dict[str, Any]:
        """`session.snapshot`: store the folded state at the current seq."""
        session = await self.manager.view(namespace, session_id)
        seq = await self._store(namespace, session_id, session["seq"], compact=False)
        return {"snapshotId": snapshot_id(seq), "seq": seq, "createdAt": iso(now_ms())}

    async def compact(self, namespace: str, session_id: str, before_seq: int | None = None) -> dict[str, Any]:
        """`session.compact`: snapshot at `before_seq` (default seq - MEMENTO_COMPACT_KEEP, capped so no
        checkpoint loses events it needs) and remove the events up to it."""
        session = await self.manager.view(namespace, session_id)
        if before_seq is not None and before_seq > session["seq"]:
            raise beyond("beforeSeq", before_seq, session["seq"])
        wanted = session["seq"] - self.settings.compact_keep if before_seq is None else before_seq
        target = min(wanted, compaction_limit(session, self.postgres))
        done = session.get("compactedSeq", 0)
        removed = 0
        if target > done:
            removed = await self._store(namespace, session_id, target, compact=True)
            COMPACTIONS.inc()
        upto = max(target, done)
        return {"snapshotId": snapshot_id(upto) if upto else None, "seq": upto, "compactedSeq": upto,
                "removed": removed, "requestedSeq": wanted}

    async def auto_compact(self, namespace: str, session_id: str) -> bool:
        """At MEMENTO_SESSION_MAX_EVENTS with MEMENTO_AUTO_COMPACT on: compact to make room (True if it did)."""
        if not self.settings.auto_compact:
            return False
        session = await self.manager.view(namespace, session_id)
        keep = min(self.settings.compact_keep, self.settings.session_max_events // 2)
        result = await self.compact(namespace, session_id, max(session["seq"] - keep, 0))
        return bool(result["removed"])

    async def _store(self, namespace: str, session_id: str, seq: int, compact: bool) -> int:
        """Fold to `seq` and store the snapshot (removing the events up to it when compacting); returns the
        removed count when compacting, else the seq."""
        skeys = keys.session_keys(namespace, session_id)
        for _ in range(3):
            _, folder, base = await self.fold_from(namespace, session_id, seq)
            note = {"sessionId": session_id, "compactedSeq": seq, "snapshotId": snapshot_id(seq)}
            try:
                removed = await self.store.call(
                    "ms_snapshot", skeys, now_ms(), seq, base,
                    pydantic_core.to_json(folder.dump()).decode(), "1" if compact else "0", MAX_SNAPSHOTS,
                    keys.session_channel(namespace, session_id),
                    encode_notification("session.compacted", note).decode(),
                    keys.announce_channel(namespace),
                    encode_notification("sessions.announce", {"type": "compacted", **note}).decode(),
                    self.settings.snapshot_max_bytes)
            except ResponseError as exc:
                if not str(exc).startswith("RETRY"):
                    raise
                continue
            return int(removed) if compact else seq
        raise Conflict("the session was compacted meanwhile; try again", {"reason": Reason.BUSY})


def auto_compaction(postgres: bool) -> FullHandler:
    """The manager's `on_full` (server/services.py passes it): a full session compacted to make room, when
    MEMENTO_AUTO_COMPACT is on (True if it removed events); `postgres` as History's."""
    async def on_full(manager: SessionManager, namespace: str, session_id: str) -> bool:
        return await History(manager, postgres).auto_compact(namespace, session_id)
    return on_full
