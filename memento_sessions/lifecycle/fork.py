"""`session.fork`: a new session whose events 1..atSeq are the parent's; the parent is unchanged.

A fork copies what it needs and nothing more, a chunk at a time (streams.py): the parent's events up to
atSeq (those compaction left), the client ids of those events, and the one snapshot its compacted range
needs. Time travel over a fork folds from that snapshot. A fork is one level deeper than its parent; past
MEMENTO_FORK_MAX_DEPTH levels it is refused, so no chain of forks copies without end.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pydantic_core

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.errors import Conflict, InvalidParams, NotFound, Reason
from memento_sessions.lifecycle.moves import Lifecycle, frames
from memento_sessions.lifecycle.postgres import Suspended
from memento_sessions.lifecycle.streams import redis_ids
from memento_sessions.metrics import LIFECYCLE
from memento_sessions.sessions.condense import state_after
from memento_sessions.sessions.manager import iso, now_ms
from memento_sessions.sessions.paging import per_read, redis_events
from memento_sessions.sessions.snapshots import SNAPSHOT_PREFIX


class Parent:
    """A fork's parent, live in Redis or stored in Postgres: its hash, its snapshots, its events and ids."""

    def __init__(self, lifecycle: Lifecycle, namespace: str, session_id: str) -> None:
        self.lifecycle, self.namespace, self.session_id = lifecycle, namespace, session_id
        self.skeys = keys.session_keys(namespace, session_id)
        self.fields: dict[str, str] = {}
        self.row: Suspended | None = None

    async def load(self) -> None:
        """Find the parent: NotFound when neither Redis nor Postgres holds its events."""
        self.fields = (await self.lifecycle.head(self.namespace, self.session_id))[0]
        if self.fields:
            return
        store = self.lifecycle.store
        row = await store.get(self.namespace, self.session_id) if store.postgres.enabled else None
        if row is None or row.status == "archived":
            raise NotFound(f"session {self.session_id!r} not found", {"sessionId": self.session_id})
        self.row, self.fields = row, row.fields

    async def snapshot(self, seq: int) -> str | None:
        """The parent's snapshot at exactly `seq`, if it has one."""
        if self.row is None:
            data: Any = await self.lifecycle.redis.hget(self.skeys.ids, f"{SNAPSHOT_PREFIX}{seq}")
            return None if data is None else str(data)
        found = await self.lifecycle.store.snapshot_at(self.row, seq)
        return found[1] if found and found[0] == seq else None

    def events(self, after: int, upto: int) -> AsyncIterator[list[str]]:
        if self.row is None:
            return redis_events(self.lifecycle.redis, self.skeys, after, upto, per_read(self.lifecycle.chunk_bytes))
        return self.lifecycle.store.events(self.row, after, upto)

    def ids(self) -> AsyncIterator[list[tuple[str, str]]]:
        if self.row is None:
            return redis_ids(self.lifecycle.redis, self.skeys, 1000)
        return self.lifecycle.store.ids(self.row)

    async def unchanged(self) -> bool:
        """Whether a live parent kept its epoch and compaction while it was copied (else events may be gone)."""
        if self.row is not None:
            return True
        now = await self.lifecycle.redis.hmget(self.skeys.session, "epoch", "compactedSeq")
        return now == [self.fields["epoch"], self.fields.get("compactedSeq")]


def client_ids(pairs: list[tuple[str, str]], at_seq: int) -> list[tuple[str, str]]:
    """The client event ids of events up to `at_seq` (not snapshots, fencing marks or a staging token)."""
    return [(k, v) for k, v in pairs if k[:1] not in ("~", "!") and v.isdigit() and int(v) <= at_seq]


async def fork(lifecycle: Lifecycle, who: Identity, session_id: str, at_seq: int, new_id: str | None) -> dict[str, Any]:
    """`session.fork`; the new session appears whole or not at all."""
    if new_id is not None:
        await lifecycle.refuse_stored(who.namespace, new_id)
    parent = Parent(lifecycle, who.namespace, session_id)
    await parent.load()
    fields = parent.fields
    seq, compacted = int(fields["seq"]), int(fields.get("compactedSeq") or 0)
    if at_seq > seq:
        raise InvalidParams("invalid params", [{"field": "atSeq", "message": f"{at_seq} is beyond the "
                                                f"session's seq {seq}"}])
    depth, limit = int(fields.get("forkDepth") or 0) + 1, lifecycle.manager.settings.fork_max_depth
    if depth > limit:
        raise Conflict(f"a fork of this session would be {depth} forks deep; at most {limit} "
                       "(MEMENTO_FORK_MAX_DEPTH)", {"reason": Reason.FORK_DEPTH})
    base_seq = min(compacted, at_seq)
    base = await parent.snapshot(base_seq) if base_seq else None
    if base_seq and base is None:
        raise Conflict(f"events up to {compacted} were compacted; no snapshot at seq {at_seq}",
                       {"reason": Reason.COMPACTED, "compactedSeq": compacted})
    sid = new_id or f"sess-{uuid.uuid4()}"
    fork_fields = fork_hash(lifecycle, who, fields, session_id, at_seq, depth, base_seq)
    manager = lifecycle.manager
    indexed = await manager.reserve(who.namespace, sid, int(fork_fields["createdAt"]))
    try:
        await write_fork(lifecycle, parent, who, sid, fork_fields, (base_seq, base))
    except BaseException:
        if indexed:
            await manager.redis.zrem(keys.session_index(who.namespace), sid)
        raise
    if new_id is not None:
        await lifecycle.withdraw_if_stored(who.namespace, new_id, fork_fields["epoch"])
    LIFECYCLE.labels("forked").inc()
    return {"sessionId": sid, "parentSessionId": session_id, "forkedAtSeq": at_seq, "seq": at_seq,
            "state": fork_fields["state"], "epoch": fork_fields["epoch"], "agentIds": [who.agent_id],
            "expiresAt": iso(now_ms() + int(fork_fields["ttl"]) * 1000)}


async def write_fork(lifecycle: Lifecycle, parent: Parent, who: Identity, sid: str, fork_fields: dict[str, str],
                     base: tuple[int, str | None]) -> None:
    """Stage the fork's snapshot, events, ids and agent into Redis, then make it live."""
    base_seq, snapshot = base
    at_seq = int(fork_fields["seq"])
    stager = lifecycle.stager(who.namespace, sid, int(fork_fields["ttl"]))
    await stager.start()
    state = pydantic_core.from_json(snapshot)["state"] if snapshot else "working"
    if snapshot:
        await stager.ids([(f"{SNAPSHOT_PREFIX}{base_seq}", snapshot), ("~snaps", str(base_seq))])
    copied = 0
    async for members in parent.events(base_seq, at_seq):
        state = state_after(members, state)
        copied += len(members)
        await stager.events(members)
    if copied != at_seq - base_seq or not await parent.unchanged():
        raise Conflict("the session was compacted while it was forked; try again", {"reason": Reason.BUSY})
    async for pairs in parent.ids():
        await stager.ids(client_ids(pairs, at_seq))
    await stager.agents([who.agent_id])
    if not (at_seq == int(parent.fields["seq"]) and parent.fields["state"] != "completed"):
        fork_fields["state"] = state
    note = {"type": "forked", "sessionId": sid, "parentSessionId": parent.session_id, "forkedAtSeq": at_seq}
    await stager.restore("fork", fork_fields, frames(who.namespace, sid, "session.forked", note, note))


def fork_hash(lifecycle: Lifecycle, who: Identity, parent: dict[str, str], parent_id: str, at_seq: int, depth: int,
              compacted: int) -> dict[str, str]:
    """The fork's hash (its state is the parent's when it forks at the parent's seq; else set once folded)."""
    now = str(now_ms())
    fields = {"state": parent["state"], "seq": str(at_seq), "createdAt": now, "updatedAt": now,
              "ttl": parent.get("ttl") or str(lifecycle.manager.settings.session_ttl), "epoch": uuid.uuid4().hex[:16],
              "labels": parent.get("labels") or "{}", "creator": who.agent_id, "parentSessionId": parent_id,
              "forkedAtSeq": str(at_seq), "forkDepth": str(depth)}
    if compacted:
        fields["compactedSeq"] = str(compacted)
    if parent.get("onIdle"):
        fields["onIdle"] = parent["onIdle"]
    return fields
