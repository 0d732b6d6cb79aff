"""A whole session read out of Redis or written into it a chunk at a time, so a suspend, resume or fork
holds at most a chunk of it in the daemon (MEMENTO_SUSPEND_CHUNK_BYTES), not all of it.

A write goes through `ms_stage` calls that fill the session's events, ids and agents while it has no hash
(every reader and writer treats a session without its hash as absent), then one `ms_restore` call that
writes the hash and publishes: the session appears whole or not at all. A write cut short leaves keys
that expire with the TTL they were given, and the next write of the id clears them first. Each `ms_stage`
call carries at most MEMENTO_STAGE_CHUNK_BYTES of events or ids (or one larger item), so no call of a
copy holds Redis's one thread for long: other clients' commands run between two calls; and a namespace's
copies write at most MEMENTO_STAGE_PACE_BYTES a second per daemon (limits.py), so one tenant's forks
leave Redis free for the others most of the time. `ms_restore`
writes only the hash and sets the TTLs: its work does not grow with the session.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from memento_sessions.errors import Conflict, Reason
from memento_sessions.keys import SessionKeys
from memento_sessions.sessions.functions import FunctionStore
from memento_sessions.sessions.paging import seq_of

SNAPSHOT_FIELDS = "~snap"  # the prefix of the ids-hash fields that are snapshots (and their list)


def parts(items: list[Any], size: Callable[[Any], int], most: int) -> Iterator[list[Any]]:
    """`items` in consecutive runs of at most `most` bytes by `size` (a larger item alone)."""
    run: list[Any] = []
    total = 0
    for item in items:
        if run and total + size(item) > most:
            yield run
            run, total = [], 0
        run.append(item)
        total += size(item)
    if run:
        yield run


def pair_size(pair: tuple[str, str]) -> int:
    return len(pair[0]) + len(pair[1])


def flat(pairs: Iterable[tuple[str, Any]]) -> list[Any]:
    """Pairs as the field, value, field, value, ... arguments of a command."""
    return [item for pair in pairs for item in pair]


def scored(members: list[str]) -> list[str | int]:
    """Stored events as the seq, member, seq, member, ... arguments of ZADD."""
    return [item for member in members for item in (seq_of(member), member)]


async def head(redis: aioredis.Redis, skeys: SessionKeys) -> tuple[dict[str, str], list[str], list[int]]:
    """A session's hash, agents and snapshot seqs, in one transaction (empty hash: not in Redis)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(skeys.session)
        pipe.smembers(skeys.agents)
        pipe.hget(skeys.ids, "~snaps")
        fields, agents, snaps = await pipe.execute()
    return fields, sorted(agents), [int(s) for s in (snaps or "").split()]


async def redis_ids(redis: aioredis.Redis, skeys: SessionKeys, count: int) -> AsyncIterator[list[tuple[str, str]]]:
    """The session's ids-hash fields other than its snapshots, about `count` per round trip."""
    cursor = 0
    while True:
        reply: Any = await redis.hscan(skeys.ids, cursor, count=count)
        cursor, found = reply
        pairs = [(k, v) for k, v in found.items() if not k.startswith(SNAPSHOT_FIELDS)]
        if pairs:
            yield pairs
        if cursor == 0:
            return


class Stager:
    """One staged write of a session into Redis (a resume or a fork): stage parts, then `restore`. Each call
    carries at most `chunk_bytes` of events or ids (or one larger item)."""

    def __init__(self, store: FunctionStore, skeys: SessionKeys, ttl: int, chunk_bytes: int,
                 pace: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.store, self.skeys, self.ttl, self.chunk_bytes = store, skeys, ttl, chunk_bytes
        self.pace = pace  # waits, before each call, for the namespace's budget of bytes a second (limits.py)
        self.token = uuid.uuid4().hex

    async def start(self) -> None:
        """Claim the id: Conflict (EXISTS) when a session holds it; leftovers of a cut-short write go."""
        await self._stage("1", "")

    async def events(self, members: list[str]) -> None:
        for run in parts(members, len, self.chunk_bytes):
            await self._paced(sum(map(len, run)))
            await self._stage("0", "z", *scored(run))

    async def ids(self, pairs: list[tuple[str, str]]) -> None:
        for run in parts(pairs, pair_size, self.chunk_bytes):
            await self._paced(sum(map(pair_size, run)))
            await self._stage("0", "h", *flat(run))

    async def agents(self, agents: list[str]) -> None:
        for start in range(0, len(agents), 1000):
            await self._stage("0", "a", *agents[start:start + 1000])

    async def restore(self, mode: str, fields: dict[str, str], frames: list[str]) -> bool:
        """Write the hash and publish: the session is live. False when a resume finds the same session
        (epoch and seq) live already."""
        done = await self._call("ms_restore", mode, self.ttl, self.token, *frames, *flat(fields.items()))
        return bool(done)

    async def _paced(self, nbytes: int) -> None:
        if self.pace is not None:
            await self.pace(nbytes)

    async def _stage(self, start: str, kind: str, *items: str | int) -> None:
        await self._call("ms_stage", self.token, self.ttl, start, kind, *items)

    async def _call(self, function: str, *args: str | int) -> Any:
        try:
            return await self.store.call(function, self.skeys, *args)
        except ResponseError as exc:
            if str(exc).startswith("RETRY"):
                raise Conflict("another write of this session took over; try again", {"reason": Reason.BUSY}) from None
            raise
