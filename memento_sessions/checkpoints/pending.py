"""Failure snapshots Postgres has not taken yet, kept in Redis so that no daemon's restart loses them.

The checkpointer writes a broken checkpoint's snapshot here *before* its anchor names it, stores it in
Postgres, then deletes it here. What Postgres could not take stays, under the session's hash tag with
a TTL of MEMENTO_SNAPSHOT_MAX_AGE_DAYS (the age at which Postgres would drop it anyway), and every
daemon's flusher stores it later. Storing is idempotent per (namespace, checkpoint id), so two daemons
flushing one entry write one row. An index ZSET names the sessions that have entries: a new daemon
finds them without a SCAN. See docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import Any, cast

import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.backends import UNAVAILABLE
from memento_sessions.checkpoints.snapshots import TRANSIENT, Snapshots
from memento_sessions.logs import get_logger
from memento_sessions.metrics import SNAPSHOTS_PENDING

log = get_logger(__name__)
PAGE = 100  # sessions read from the index at a time
MAX_PAGES = 100  # per pass: a pass ends even if puts keep racing it

# Forget a session in the index only if no put touched it since the pass read it (a put bumps the score
# after writing its entry, so an entry written while the pass ran is never left without an index entry).
FORGET_IF_UNCHANGED = """
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Pending:
    """One failure snapshot as the checkpoint made it: the events `from_seq` < seq <= `to_seq` of an epoch."""

    namespace: str
    session_id: str
    checkpoint_id: str
    epoch: str
    from_seq: int
    to_seq: int
    outcome: str
    events: list[dict[str, Any]]
    snapshot_at: datetime

    def dumps(self) -> str:
        """The entry's JSON text in Redis (the fields as they are: asdict would deep-copy every event first)."""
        fields = {field.name: getattr(self, field.name) for field in dataclass_fields(self)}
        return json.dumps({**fields, "snapshot_at": self.snapshot_at.isoformat()})

    @classmethod
    def loads(cls, text: str | bytes) -> Pending:
        """An entry read back from Redis."""
        fields = json.loads(text)
        return cls(**{**fields, "snapshot_at": datetime.fromisoformat(fields["snapshot_at"])})

    async def store(self, snapshots: Snapshots) -> int:
        """Store the row in Postgres (once per namespace and checkpoint id); its id."""
        return await snapshots.store_snapshot(self.namespace, self.session_id, self.checkpoint_id, self.outcome,
                                              self.events, self.snapshot_at, epoch=self.epoch,
                                              from_seq=self.from_seq, to_seq=self.to_seq)


def index_member(namespace: str, session_id: str) -> str:
    """A session in the index: JSON, since neither part may contain the other's separator otherwise."""
    return json.dumps([namespace, session_id])


class PendingSnapshots:
    """The pending snapshots of every namespace in one Redis."""

    def __init__(self, redis: aioredis.Redis, ttl_seconds: int) -> None:
        self.redis = redis
        self.ttl = ttl_seconds

    async def put(self, pending: Pending) -> None:
        """Keep `pending` until `done`; it survives this process, and every daemon's flusher finds it."""
        await self.write(pending)
        await self.index(pending)

    async def write(self, pending: Pending) -> None:
        """put's first half: the entry, which `done` deletes. Until `index` returns, only this process knows it."""
        key = keys.pending_snapshots(pending.namespace, pending.session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, pending.checkpoint_id, pending.dumps())
            pipe.expire(key, self.ttl)
            await pipe.execute()

    async def index(self, pending: Pending) -> None:
        """put's second half, after `write`: the session in the index every daemon's flusher reads. Another slot
        than the entry's on a Cluster, so never in its transaction."""
        # µs as an integer: exact in a ZSET score, and a new value for every put (see FORGET_IF_UNCHANGED)
        member = index_member(pending.namespace, pending.session_id)
        await self.redis.zadd(keys.pending_snapshot_index(), {member: time.time_ns() // 1000})

    async def done(self, pending: Pending) -> None:
        """Postgres holds `pending` now; the session's index entry goes at the next flush pass."""
        await self.redis.hdel(keys.pending_snapshots(pending.namespace, pending.session_id), pending.checkpoint_id)

    async def entries(self, namespace: str, session_id: str) -> list[Pending]:
        """The session's pending snapshots, oldest seq first."""
        found = await self.redis.hvals(keys.pending_snapshots(namespace, session_id))
        return sorted((Pending.loads(text) for text in found), key=lambda p: (p.from_seq, p.to_seq))

    async def flush(self, snapshots: Snapshots) -> int:
        """Store every pending snapshot Postgres takes now; how many. A transient error ends the pass."""
        try:
            return await self._pass(snapshots)
        finally:
            with contextlib.suppress(*UNAVAILABLE):
                SNAPSHOTS_PENDING.set(await self._count())

    async def _pass(self, snapshots: Snapshots) -> int:
        index, stored, kept = keys.pending_snapshot_index(), 0, 0
        for _ in range(MAX_PAGES):
            page = cast(list[tuple[bytes | str, float]],
                        await self.redis.zrange(index, kept, kept + PAGE - 1, withscores=True))
            for member, score in page:
                done, left = await self._flush_session(snapshots, member)
                stored += done
                if left or not await self.redis.eval(FORGET_IF_UNCHANGED, 1, index, member, int(score)):
                    kept += 1
            if len(page) < PAGE:
                break
        return stored

    async def _flush_session(self, snapshots: Snapshots, member: str | bytes) -> tuple[int, int]:
        """Store the session's entries; (stored, left) where left are entries Postgres refused for good."""
        namespace, session_id = json.loads(member)
        key = keys.pending_snapshots(namespace, session_id)
        stored, left = 0, 0
        checkpoint_ids: list[bytes | str] = await self.redis.hkeys(key)
        for checkpoint_id in checkpoint_ids:
            text: bytes | str | None = await self.redis.hget(key, checkpoint_id)
            if text is None:
                continue  # another daemon stored it meanwhile
            if await _store_one(snapshots, Pending.loads(text)):
                await self.redis.hdel(key, checkpoint_id)
                stored += 1
            else:
                left += 1
        return stored, left

    async def _count(self) -> int:
        """Pending entries of the first page of sessions (the gauge; a full count could take long)."""
        members = cast(list[bytes | str], await self.redis.zrange(keys.pending_snapshot_index(), 0, PAGE - 1))
        sizes = [await self.redis.hlen(keys.pending_snapshots(*json.loads(member))) for member in members]
        return sum(sizes)


async def _store_one(snapshots: Snapshots, pending: Pending) -> bool:
    """Store one entry; False when Postgres refuses it for good (kept until its TTL, logged, never retried
    in a tight loop). Transient errors propagate: the whole pass waits for Postgres."""
    try:
        await pending.store(snapshots)
    except TRANSIENT:
        raise
    except Exception as exc:  # e.g. a value Postgres cannot store: keep the rest flowing
        log.error("pending failure snapshot refused by Postgres", checkpoint_id=pending.checkpoint_id,
                  error=repr(exc))
        return False
    log.info("deferred failure snapshot stored", checkpoint_id=pending.checkpoint_id)
    return True
