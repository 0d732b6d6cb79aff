"""The session lifecycle: suspend (Redis -> Postgres), resume (back, same seqs), and clear; fork is in fork.py.

Each move streams the session a chunk at a time (streams.py), and each step leaves a mark that says which
copy is authoritative if the daemon dies before the next one:

- suspend: the copy is written to Postgres as `suspending` (one transaction); Redis then removes the
  session in one Function call that checks it did not move on meanwhile (else it copies again); the row
  is then marked `suspended`. Until that mark, the live copy in Redis is the authority: it stays listed,
  and a stored row still `suspending` whose live copy has gone may be older than what that copy reached.
- resume: the row is marked `resuming`, the session is listed, staged into Redis and made live in one
  Function call, then the row is deleted. A `resuming` row found later whose session Redis holds is done;
  one whose session Redis does not hold may be older than a live copy that expired since.

A row caught mid-move (`suspending` or `resuming`) with no live copy in Redis is revived under a new epoch:
subscribers resuming by seq see the epoch change and start over, so no seq is reused in an epoch.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from functools import partial
from typing import Any, NoReturn

import pydantic_core
from redis.exceptions import ResponseError

from memento_sessions import keys
from memento_sessions.errors import Conflict, NotFound, Reason
from memento_sessions.lifecycle.postgres import LIVE_STATUSES, Suspended, SuspendedStore
from memento_sessions.lifecycle.streams import Stager, head, redis_ids
from memento_sessions.limits import Pacer
from memento_sessions.metrics import LIFECYCLE, PACED_SECONDS
from memento_sessions.rpc import encode_notification
from memento_sessions.sessions.condense import Condenser
from memento_sessions.sessions.manager import SessionManager, now_ms
from memento_sessions.sessions.paging import per_read, redis_events
from memento_sessions.usage.query import session_totals

Head = tuple[dict[str, str], list[str], list[int]]  # a session's hash, agents and snapshot seqs


def frames(namespace: str, session_id: str, method: str, announce: dict[str, Any], note: dict[str, Any]) -> list[str]:
    """The session's frame and its namespace's announcement of a move."""
    return [keys.session_channel(namespace, session_id), encode_notification(method, note).decode(),
            keys.announce_channel(namespace), encode_notification("sessions.announce", announce).decode()]


def fingerprint(fields: dict[str, str], snaps: list[int]) -> list[str]:
    """What ms_suspend compares to know Redis still holds the copy that was stored."""
    return [fields["epoch"], fields["seq"], fields.get("updatedAt", ""), fields.get("compactedSeq", ""),
            " ".join(str(s) for s in snaps)]


def taken(session_id: str, status: str) -> Conflict:
    """The refusal of a new session under an id Postgres holds a session by (`status` its row's)."""
    reason = Reason.SUSPENDED if status in LIVE_STATUSES else status
    return Conflict(f"session id {session_id!r} is taken by a {reason} session", {"reason": reason})


class Moved(Exception):
    """The session changed in Redis while it was copied: the copy is not stored."""


class Lifecycle:
    """Suspend, resume and clear over one SessionManager and the stored sessions' table."""

    def __init__(self, manager: SessionManager, store: SuspendedStore) -> None:
        self.manager, self.redis, self.store = manager, manager.redis, store
        self.chunk_bytes = manager.settings.suspend_chunk_bytes
        self.stage_bytes = manager.settings.stage_chunk_bytes
        self.copies = Pacer(manager.settings.stage_pace_bytes, PACED_SECONDS.labels("copy"))
        store.chunk_bytes = self.chunk_bytes

    def stager(self, namespace: str, session_id: str, ttl: int) -> Stager:
        """A staged write of the session into Redis, in calls of MEMENTO_STAGE_CHUNK_BYTES, paced per namespace."""
        return Stager(self.manager.store, keys.session_keys(namespace, session_id), ttl, self.stage_bytes,
                      partial(self.copies.take, namespace))

    async def head(self, namespace: str, session_id: str) -> Head:
        """The session's hash, agents and snapshot seqs in Redis (an empty hash: Redis does not hold it)."""
        return await head(self.redis, keys.session_keys(namespace, session_id))

    async def store_copy(self, namespace: str, session_id: str, status: str, found: Head, at: datetime) -> Suspended:
        """Write the session Redis holds into Postgres with `status`, a chunk at a time, with its summary."""
        fields, agents, snaps = found
        skeys = keys.session_keys(namespace, session_id)
        row = Suspended(namespace, session_id, fields["epoch"], int(fields["seq"]), status, fields["state"], fields,
                        agents, {}, None, {}, at)
        compacted, folder = int(fields.get("compactedSeq") or 0), Condenser()
        async with self.store.write(row) as writer:
            for seq in snaps:
                data: Any = await self.redis.hget(skeys.ids, f"~snap:{seq}")
                if data is not None:
                    await writer.snapshot(seq, data)
                    if seq == compacted:
                        folder = Condenser.load(pydantic_core.from_json(data))
            async for members in redis_events(self.redis, skeys, 0, None, per_read(self.chunk_bytes)):
                folder.add([pydantic_core.from_json(member) for member in members])
                await writer.events(members)
            async for pairs in redis_ids(self.redis, skeys, 1000):
                await writer.ids(pairs)
            if await self.fingerprint(skeys) != fingerprint(fields, snaps):
                raise Moved  # another daemon moved it (or a write landed) mid-copy: this copy is rolled back
            # The usage totals go with the row: their keys in Redis expire on their own TTL (docs/usage.md).
            usage = (await session_totals(self.redis, namespace, session_id))["totals"]
            await writer.finish({**folder.result(), "usage": usage})
        return row

    async def fingerprint(self, skeys: keys.SessionKeys) -> list[str]:
        """The session's fingerprint as Redis holds it now (epoch "" when it is gone)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hmget(skeys.session, "epoch", "seq", "updatedAt", "compactedSeq")
            pipe.hget(skeys.ids, "~snaps")
            now, snaps = await pipe.execute()
        return [value or "" for value in now] + [snaps or ""]

    async def suspend(self, namespace: str, session_id: str) -> dict[str, Any]:
        """`session.suspend`: move the session into Postgres, whole; suspending twice is harmless."""
        skeys = keys.session_keys(namespace, session_id)
        for _ in range(5):  # a write that lands between the copy and the removal makes the copy go again
            found = await self.head(namespace, session_id)
            fields = found[0]
            if not fields:
                return await self._already_suspended(namespace, session_id)
            if fields["state"] == "completed":
                raise Conflict("a completed session is not suspended", {"reason": Reason.COMPLETED})
            try:
                row = await self.store_copy(namespace, session_id, "suspending", found, datetime.now(UTC))
            except Moved:
                continue
            note = {"sessionId": session_id, "seq": row.seq, "epoch": row.epoch}
            try:
                await self.manager.store.call("ms_suspend", skeys, *fingerprint(fields, found[2]), *frames(
                    namespace, session_id, "session.suspended", {"type": "suspended", **note}, note))
            except ResponseError as exc:
                if str(exc).startswith("RETRY"):
                    continue
                raise
            await self.store.mark(row, "suspended", ("suspending",))
            await self.redis.zrem(keys.session_index(namespace), session_id)
            LIFECYCLE.labels("suspended").inc()
            return {"sessionId": session_id, "status": "suspended", "seq": row.seq, "epoch": row.epoch}
        raise Conflict("the session kept changing while it was suspended; try again", {"reason": Reason.BUSY})

    async def keep_completed(self, namespace: str, session_id: str) -> bool:
        """Copy a completed session into Postgres (status `completed`), where it outlives its grace TTL in
        Redis until it is archived; False when Redis holds no completed session by that id (any more)."""
        found = await self.head(namespace, session_id)
        fields = found[0]
        if fields.get("state") != "completed":
            return False
        completed_at = datetime.fromtimestamp(int(fields["updatedAt"]) / 1000, UTC)  # the final checkpoint's time
        try:
            await self.store_copy(namespace, session_id, "completed", found, completed_at)
        except Moved:
            return False
        LIFECYCLE.labels("kept").inc()
        return True

    async def _already_suspended(self, namespace: str, session_id: str) -> dict[str, Any]:
        row = await self.store.get(namespace, session_id)
        if row is None:
            raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})
        if row.status == "completed":
            raise Conflict("a completed session is not suspended", {"reason": Reason.COMPLETED})
        status = "suspended" if row.status in LIVE_STATUSES else row.status
        return {"sessionId": session_id, "status": status, "seq": row.seq, "epoch": row.epoch}

    async def resume(self, namespace: str, session_id: str) -> dict[str, Any]:
        """`session.resume`: back into Redis with the same seqs (and epoch, unless the row was caught
        mid-move by a crash); once, whatever daemons race."""
        row = await self.store.get(namespace, session_id)
        if row is None or row.status not in LIVE_STATUSES:
            await self._not_resumable(namespace, session_id, row)
        skeys = keys.session_keys(namespace, session_id)
        epoch = row.epoch
        if row.status != "suspended":
            live = await self.redis.hmget(skeys.session, "epoch", "seq")
            if live[0] is not None:  # Redis holds it: the live copy is the authority
                if row.status == "resuming" and live == [row.epoch, str(row.seq)]:
                    await self.store.resumed(row)  # a resume cut short after its restore: finish it
                raise Conflict("the session is active, not suspended", {"reason": Reason.ACTIVE})
            epoch = uuid.uuid4().hex[:16]  # the live copy may have gone further before it expired
        if not await self.store.mark(row, "resuming", LIVE_STATUSES):
            raise Conflict("the stored session changed meanwhile; try again", {"reason": Reason.BUSY})
        resuming = dataclasses.replace(row, status="resuming")
        try:
            done = await self._write_back(resuming, epoch)
        except Conflict as exc:
            if isinstance(exc.data, dict) and exc.data.get("reason") == Reason.ACTIVE:
                # Another session holds the id in Redis: the stored one stays as it was, not being resumed
                # (a row being resumed may be replaced by the live copy's suspend).
                await self.store.mark(resuming, row.status, ("resuming",))
            raise
        row = resuming
        await self.store.resumed(row)
        if done:
            LIFECYCLE.labels("resumed").inc()
        return {"sessionId": session_id, "status": "active", "seq": row.seq, "epoch": epoch}

    async def _write_back(self, row: Suspended, epoch: str) -> bool:
        """Stage the stored session into Redis and make it live; False when it was live already."""
        namespace, session_id = row.namespace, row.session_id
        fields = {**row.fields, "updatedAt": str(now_ms()), "epoch": epoch}
        ttl = int(fields.get("ttl") or self.manager.settings.session_ttl)
        await self.manager.index(namespace, session_id, int(row.fields["createdAt"]))  # listed before it is live
        stager = self.stager(namespace, session_id, ttl)
        note = {"sessionId": session_id, "seq": row.seq, "epoch": epoch}
        try:
            await stager.start()
        except Conflict:
            live = await self.redis.hmget(keys.session_keys(namespace, session_id).session, "epoch", "seq")
            if live == [epoch, str(row.seq)]:
                return False
            raise Conflict("the session is active, not suspended", {"reason": Reason.ACTIVE}) from None
        snaps = await self.store.snapshot_seqs(row)
        for seq in snaps:
            snap = await self.store.snapshot_at(row, seq)
            if snap is not None:
                await stager.ids([(f"~snap:{seq}", snap[1])])
        if snaps:
            await stager.ids([("~snaps", " ".join(str(s) for s in snaps))])
        async for pairs in self.store.ids(row):
            await stager.ids(pairs)
        async for members in self.store.events(row, 0):
            await stager.events(members)
        await stager.agents(row.agents)
        try:
            return await stager.restore("resume", fields, frames(namespace, session_id, "session.resumed",
                                                                 {"type": "resumed", **note}, note))
        except Conflict as exc:
            if "active" in exc.message:  # another session took the id in Redis meanwhile
                exc.data = {"reason": Reason.ACTIVE}
            raise

    async def _not_resumable(self, namespace: str, session_id: str, row: Suspended | None) -> NoReturn:
        """Raise why a session that is not suspended cannot be resumed (writing nothing)."""
        if row is not None and row.status == "archived":
            raise Conflict("the session is archived: its events are gone", {"reason": Reason.ARCHIVED})
        if row is not None and row.status == "completed":
            raise Conflict("the session is completed, not suspended", {"reason": Reason.COMPLETED})
        if await self.redis.exists(keys.session_keys(namespace, session_id).session):
            raise Conflict("the session is active, not suspended", {"reason": Reason.ACTIVE})
        raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})

    async def refuse_stored(self, namespace: str, session_id: str) -> None:
        """Conflict when Postgres holds a session by this id (suspended, completed or archived): a new session
        by its id would hide it, and suspending that one would meet another epoch's row."""
        if not self.store.postgres.enabled:
            return
        status = await self.store.status(namespace, session_id)
        if status is not None:
            raise taken(session_id, status)

    async def withdraw_if_stored(self, namespace: str, session_id: str, epoch: str) -> None:
        """After a create or fork under a client's id: if Postgres holds a session by that id now (its suspend
        completed between refuse_stored and the write), remove the new session (only that epoch's) and refuse."""
        status = await self.store.status(namespace, session_id) if self.store.postgres.enabled else None
        if status is None:
            return
        if await self.manager.store.call("ms_withdraw", keys.session_keys(namespace, session_id), epoch):
            await self.redis.zrem(keys.session_index(namespace), session_id)
        raise taken(session_id, status)

    async def clear(self, namespace: str, session_id: str) -> dict[str, Any]:
        """`session.clear` (admin): delete a session wherever it is, Redis and Postgres."""
        removed = await self.redis.delete(*keys.session_keys(namespace, session_id).all())
        await self.redis.zrem(keys.session_index(namespace), session_id)
        stored = await self.store.forget(namespace, session_id) if self.store.postgres.enabled else False
        if not removed and not stored:
            raise NotFound(f"session {session_id!r} not found", {"sessionId": session_id})
        LIFECYCLE.labels("cleared").inc()
        return {"sessionId": session_id, "cleared": True}
