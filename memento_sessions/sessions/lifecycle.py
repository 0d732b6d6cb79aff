"""The session lifecycle: suspend (Redis -> Postgres), resume (back, same seqs and epoch), fork.

A suspend copies the whole session into Postgres first and removes it from Redis only after, in one
Function call that checks the session did not move on meanwhile (else it copies again): a session is
never in neither place. Two daemons suspending at once store the same row (an idempotent upsert) and
only one removal happens. A resume writes the session back in one Function call that refuses an active
session, so it also happens once; the Postgres row is forgotten afterwards.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, NoReturn

import pydantic_core
from redis.exceptions import ResponseError

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.errors import Conflict, InvalidParams, NotFound
from memento_sessions.metrics import LIFECYCLE
from memento_sessions.rpc import encode_notification
from memento_sessions.sessions.condense import Condenser, state_after
from memento_sessions.sessions.manager import SessionManager, iso, now_ms
from memento_sessions.sessions.paging import seq_of
from memento_sessions.sessions.snapshot_store import SNAPSHOT_LIST, SNAPSHOT_PREFIX, is_snapshot_field
from memento_sessions.sessions.stored import members_between
from memento_sessions.sessions.suspended import Suspended, SuspendedStore

Copy = tuple[dict[str, str], list[str], dict[str, str], list[str]]  # hash, agents, ids, event members


def fold_copy(fields: dict[str, str], ids: dict[str, str], members: list[str]) -> Condenser:
    """The reducer over a copied session: its compaction snapshot plus the events it still holds."""
    compacted = int(fields.get("compactedSeq") or 0)
    base = ids.get(f"{SNAPSHOT_PREFIX}{compacted}") if compacted else None
    folder = Condenser.load(pydantic_core.from_json(base)) if base else Condenser()
    folder.add([pydantic_core.from_json(member) for member in members])
    return folder


def scored(members: list[str]) -> list[str | int]:
    """Stored events as the seq, member, seq, member, ... arguments of a Function.

    A session's seqs are contiguous (only compaction removes events, from the start), so they are counted
    from the first; each is read from its member only if the last one says otherwise.
    """
    first = seq_of(members[0]) if members else 0
    args: list[str | int] = [0] * (2 * len(members))
    contiguous = not members or seq_of(members[-1]) == first + len(members) - 1
    args[0::2] = range(first, first + len(members)) if contiguous else [seq_of(member) for member in members]
    args[1::2] = members
    return args


def flat(pairs: dict[str, str]) -> list[str]:
    """A mapping as the field, value, field, value, ... arguments of a Function."""
    return [item for pair in pairs.items() for item in pair]


def forked_ids(ids: dict[str, str], at_seq: int) -> dict[str, str]:
    """The parent's event ids and snapshots up to `at_seq`: the fork's idempotency and time travel."""
    kept = {k: v for k, v in ids.items() if not is_snapshot_field(k) and int(v) <= at_seq}
    snaps = [s for s in (ids.get(SNAPSHOT_LIST) or "").split() if int(s) <= at_seq]
    kept.update({f"{SNAPSHOT_PREFIX}{s}": ids[f"{SNAPSHOT_PREFIX}{s}"] for s in snaps})
    if snaps:
        kept[SNAPSHOT_LIST] = " ".join(snaps)
    return kept


def stored_row(namespace: str, session_id: str, status: str, copied: Copy, at: datetime) -> Suspended:
    """The Postgres row of a session copied out of Redis, with its condensed summary."""
    fields, agents, ids, members = copied
    return Suspended(namespace, session_id, fields["epoch"], int(fields["seq"]), status, fields["state"], fields,
                     agents, ids, members, fold_copy(fields, ids, members).result(), at)


class Lifecycle:
    """Suspend, resume and fork over one SessionManager and the suspended sessions' table."""

    def __init__(self, manager: SessionManager, store: SuspendedStore) -> None:
        self.manager, self.redis, self.store = manager, manager.redis, store

    async def copy(self, namespace: str, session_id: str) -> Copy:
        """Everything Redis holds of a session, in one transaction."""
        skeys = keys.session_keys(namespace, session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(skeys.session)
            pipe.smembers(skeys.agents)
            pipe.hgetall(skeys.ids)
            pipe.zrange(skeys.events, 0, -1)
            fields, agents, ids, members = await pipe.execute()
        return fields, sorted(agents), ids, members

    async def suspend(self, namespace: str, session_id: str) -> dict[str, Any]:
        """`session.suspend`: move the session into Postgres, whole; suspending twice is harmless."""
        skeys = keys.session_keys(namespace, session_id)
        for _ in range(5):  # an emit that lands between the copy and the removal makes the copy go again
            fields, agents, ids, members = await self.copy(namespace, session_id)
            if not fields:
                return await self._already_suspended(namespace, session_id)
            if fields["state"] == "completed":
                raise Conflict("a completed session is not suspended", {"reason": "completed"})
            row = stored_row(namespace, session_id, "suspended", (fields, agents, ids, members), datetime.now(UTC))
            await self.store.put(row)
            note = {"sessionId": session_id, "seq": row.seq, "epoch": row.epoch}
            try:
                await self.manager.store.call("ms_suspend", skeys, row.epoch, row.seq, *self._frames(
                    namespace, session_id, "session.suspended", {"type": "suspended", **note}, note))
            except ResponseError as exc:
                if str(exc).startswith("RETRY"):
                    continue
                raise
            await self.redis.zrem(keys.session_index(namespace), session_id)
            LIFECYCLE.labels("suspended").inc()
            return {"sessionId": session_id, "status": "suspended", "seq": row.seq, "epoch": row.epoch}
        raise Conflict("the session kept changing while it was suspended; try again", {"reason": "busy"})

    async def keep_completed(self, namespace: str, session_id: str) -> bool:
        """Copy a completed session into Postgres (status `completed`), where it outlives its grace TTL in
        Redis until it is archived; False when Redis holds no completed session by that id (any more)."""
        copied = await self.copy(namespace, session_id)
        fields = copied[0]
        if fields.get("state") != "completed":
            return False
        completed_at = datetime.fromtimestamp(int(fields["updatedAt"]) / 1000, UTC)  # the final checkpoint's time
        await self.store.put(stored_row(namespace, session_id, "completed", copied, completed_at))
        LIFECYCLE.labels("kept").inc()
        return True

    async def _already_suspended(self, namespace: str, session_id: str) -> dict[str, Any]:
        row = await self.store.get(namespace, session_id)
        if row is None:
            raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})
        if row.status == "completed":
            raise Conflict("a completed session is not suspended", {"reason": "completed"})
        return {"sessionId": session_id, "status": row.status, "seq": row.seq, "epoch": row.epoch}

    @staticmethod
    def _frames(namespace: str, session_id: str, method: str, announce: dict[str, Any],
                note: dict[str, Any]) -> list[str]:
        return [keys.session_channel(namespace, session_id), encode_notification(method, note).decode(),
                keys.announce_channel(namespace), encode_notification("sessions.announce", announce).decode()]

    async def resume(self, namespace: str, session_id: str) -> dict[str, Any]:
        """`session.resume`: back into Redis with the same seqs and epoch; once, whatever daemons race."""
        row = await self.store.get(namespace, session_id)
        if row is None or row.status != "suspended":
            await self._not_resumable(namespace, session_id, row)
        note = {"sessionId": session_id, "seq": row.seq, "epoch": row.epoch}
        fields = {**row.fields, "updatedAt": str(now_ms())}
        done = await self._restore(namespace, session_id, "resume", fields, row.agents, row.ids, row.events or [],
                                   self._frames(namespace, session_id, "session.resumed",
                                                {"type": "resumed", **note}, note))
        await self.store.resumed(row)
        await self.manager.index(namespace, session_id, int(row.fields["createdAt"]))
        if done:
            LIFECYCLE.labels("resumed").inc()
        return {"sessionId": session_id, "status": "active", "seq": row.seq, "epoch": row.epoch}

    async def _not_resumable(self, namespace: str, session_id: str, row: Suspended | None) -> NoReturn:
        """Raise why a session that is not suspended cannot be resumed (writing nothing)."""
        if row is not None and row.status == "archived":
            raise Conflict("the session is archived: its events are gone", {"reason": "archived"})
        if row is not None and row.status == "completed":
            raise Conflict("the session is completed, not suspended", {"reason": "completed"})
        if await self.redis.exists(keys.session_keys(namespace, session_id).session):
            raise Conflict("the session is active, not suspended", {"reason": "active"})
        raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})

    async def _restore(self, namespace: str, session_id: str, mode: str, fields: dict[str, str], agents: list[str],
                       ids: dict[str, str], members: list[str], frames: list[str]) -> bool:
        ttl = int(fields.get("ttl") or self.manager.settings.session_ttl)
        args: list[str | int] = [mode, ttl, *frames, len(fields), *flat(fields), len(agents), *agents,
                                 len(ids), *flat(ids)]
        args += scored(members)
        try:
            done = await self.manager.store.call("ms_restore", keys.session_keys(namespace, session_id), *args)
        except Conflict as exc:
            if "active" in exc.message:
                exc.data = {"reason": "active"}
            raise
        return bool(done)

    async def clear(self, namespace: str, session_id: str) -> dict[str, Any]:
        """`session.clear` (admin): delete a session wherever it is, Redis and Postgres."""
        removed = await self.redis.delete(*keys.session_keys(namespace, session_id).all())
        await self.redis.zrem(keys.session_index(namespace), session_id)
        stored = await self.store.forget(namespace, session_id) if self.store.postgres.enabled else False
        if not removed and not stored:
            raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})
        LIFECYCLE.labels("cleared").inc()
        return {"sessionId": session_id, "cleared": True}

    async def fork(self, who: Identity, session_id: str, at_seq: int, new_id: str | None) -> dict[str, Any]:
        """`session.fork`: a new session whose events 1..atSeq are the parent's; the parent is unchanged."""
        fields, ids, members = await self._parent(who.namespace, session_id)
        seq, compacted = int(fields["seq"]), int(fields.get("compactedSeq") or 0)
        if at_seq > seq:
            raise InvalidParams("invalid params", [{"field": "atSeq", "message": f"{at_seq} is beyond the "
                                                    f"session's seq {seq}"}])
        kept_ids = forked_ids(ids, at_seq)
        if at_seq < compacted and f"{SNAPSHOT_PREFIX}{at_seq}" not in kept_ids:
            raise Conflict(f"events up to {compacted} were compacted; no snapshot at seq {at_seq}",
                           {"reason": "compacted", "compactedSeq": compacted})
        kept = members_between(members, 0, at_seq)
        fork_fields = self._fork_fields(who, fields, kept_ids, kept, session_id, at_seq)
        sid = new_id or f"sess-{uuid.uuid4()}"
        note = {"type": "forked", "sessionId": sid, "parentSessionId": session_id, "forkedAtSeq": at_seq}
        frames = self._frames(who.namespace, sid, "session.forked", note, note)
        indexed = await self.manager.reserve(who.namespace, sid, int(fork_fields["createdAt"]))
        try:
            await self._restore(who.namespace, sid, "fork", fork_fields, [who.agent_id], kept_ids, kept, frames)
        except BaseException:
            if indexed:
                await self.redis.zrem(keys.session_index(who.namespace), sid)
            raise
        LIFECYCLE.labels("forked").inc()
        return {"sessionId": sid, "parentSessionId": session_id, "forkedAtSeq": at_seq, "seq": at_seq,
                "state": fork_fields["state"], "epoch": fork_fields["epoch"], "agentIds": [who.agent_id],
                "expiresAt": iso(now_ms() + int(fork_fields["ttl"]) * 1000)}

    async def _parent(self, namespace: str, session_id: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
        """A parent's hash, ids and events: from Redis, or from Postgres while it is suspended."""
        fields, _, ids, members = await self.copy(namespace, session_id)
        if fields:
            return fields, ids, members
        row = await self.store.get(namespace, session_id) if self.store.postgres.enabled else None
        if row is None or row.events is None:
            raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})
        return row.fields, row.ids, row.events

    def _fork_fields(self, who: Identity, parent: dict[str, str], ids: dict[str, str], kept: list[str],
                     parent_id: str, at_seq: int) -> dict[str, str]:
        now = str(now_ms())
        compacted = min(int(parent.get("compactedSeq") or 0), at_seq)
        base = ids.get(f"{SNAPSHOT_PREFIX}{compacted}") if compacted else None
        if at_seq == int(parent["seq"]) and parent["state"] != "completed":
            state = parent["state"]  # the Function keeps the state after the last event: nothing to fold
        else:
            state = state_after(kept, pydantic_core.from_json(base)["state"] if base else "working")
        fields = {"state": state, "seq": str(at_seq), "createdAt": now, "updatedAt": now,
                  "ttl": parent.get("ttl") or str(self.manager.settings.session_ttl), "epoch": uuid.uuid4().hex[:16],
                  "labels": parent.get("labels") or "{}", "creator": who.agent_id, "parentSessionId": parent_id,
                  "forkedAtSeq": str(at_seq)}
        if compacted:
            fields["compactedSeq"] = str(compacted)
        if parent.get("onIdle"):
            fields["onIdle"] = parent["onIdle"]
        return fields
