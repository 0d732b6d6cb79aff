"""History and lifecycle: time travel, rehydration after compaction, fork, suspend and resume.

Each figure is the in-process call the daemon makes for the method (History, Lifecycle), beside a floor
of bare redis-py (and asyncpg) doing the same backend work in the same run: the reads of the snapshot and
of the events after it, the copy of the events, the row written to Postgres.
"""

from __future__ import annotations

import json
import random
from typing import cast

import asyncpg

from bench.harness import PAYLOAD, Env, Figure, Samples, Target, latency_extra, new_session, pct, timed
from bench.watch import quiet
from memento_sessions import keys
from memento_sessions.backends import Postgres
from memento_sessions.history.views import History
from memento_sessions.lifecycle.fork import fork as fork_session
from memento_sessions.lifecycle.moves import Lifecycle
from memento_sessions.lifecycle.postgres import SuspendedStore
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import EventIn

BATCH, SNAPSHOT_EVERY = 500, 1000
EVENT = EventIn.model_validate(PAYLOAD)


async def filled(env: Env, manager: SessionManager, history: History | None, count: int) -> str:
    """A session of `count` PAYLOAD events, with a snapshot every SNAPSHOT_EVERY when `history` is given."""
    sid = await new_session(env, manager)
    for done in range(0, count, BATCH):
        await manager.emit_batch(env.who(), sid, [EVENT] * BATCH)
        if history is not None and (done + BATCH) % SNAPSHOT_EVERY == 0:
            await history.snapshot(env.namespace, sid)
    return sid


async def checkpointed(env: Env, sid: str) -> None:
    """As if a working checkpoint had just run, so compaction may go up to the current seq."""
    skeys = keys.session_keys(env.namespace, sid)
    seq = int(await env.redis.hget(skeys.session, "seq") or 0)
    await env.redis.hset(skeys.session, "lastCheckpoint", json.dumps({"id": "cp", "seq": seq, "snapshotSeq": 0}))


async def bare_rehydrate(env: Env, sid: str, at: int) -> None:
    """The floor: the snapshot list, the snapshot and the events after it, decoded, by bare redis-py."""
    skeys = keys.session_keys(env.namespace, sid)
    base = max((s for s in map(int, (await env.redis.hget(skeys.ids, "~snaps") or "").split()) if s <= at), default=0)
    json.loads(str(await env.redis.hget(skeys.ids, f"~snap:{base}") or "{}"))
    members = await env.redis.zrangebyscore(skeys.events, f"({base}", at)
    [json.loads(str(member)) for member in members]


async def time_travel(env: Env) -> list[Figure]:
    """session.get {atSeq} p99 on a 100,000-event session with snapshots every 1,000; then rehydration
    (snapshot + the 1,000 events after it) once the session is compacted."""
    count, reads = (20_000, 100) if env.quick else (100_000, 300)
    manager = env.manager()
    history = History(manager, postgres=False)
    sid = await filled(env, manager, history, count)
    rng = random.Random(7)
    seqs = [rng.randint(1, count) for _ in range(reads)]
    await quiet(env)
    ours = await timed(reads, lambda i: history.get_at(env.namespace, sid, seqs[i]))
    floor = await timed(reads, lambda i: bare_rehydrate(env, sid, seqs[i]))
    at = Figure(f"session.get atSeq p99 ({count:,} events, snapshot every 1,000)", "ms", pct(ours, 0.99),
                pct(floor, 0.99), Target.below_ms(20), higher_is_better=False, extra=latency_extra(ours, floor))
    await checkpointed(env, sid)
    await history.compact(env.namespace, sid)
    ours2 = await timed(reads // 3, lambda _: history.get_at(env.namespace, sid, count))
    floor2 = await timed(reads // 3, lambda _: bare_rehydrate(env, sid, count))
    rehydrate = Figure(f"rehydrate after compaction p99 ({count:,} events)", "ms", pct(ours2, 0.99), pct(floor2, 0.99),
                       Target.below_ms(50), higher_is_better=False, extra=latency_extra(ours2, floor2))
    return [at, rehydrate]


async def moves(env: Env) -> list[Figure]:
    """Fork of a 10,000-event session; suspend and resume of one, beside the bare copies."""
    count, rounds = 10_000, (3 if env.quick else 8)
    manager = env.manager()
    store = SuspendedStore(Postgres(env.postgres_dsn))
    lifecycle = Lifecycle(manager, store)
    try:
        await store.migrate()
        parents = [await filled(env, manager, None, count) for _ in range(rounds)]
        await quiet(env)
        fork = await timed(rounds, lambda i: fork_session(lifecycle, env.who(), parents[i], count, None))
        fork_floor = await timed(rounds, lambda i: bare_copy(env, parents[i], f"bare-fork-{i}"))
        suspend = await timed(rounds, lambda i: lifecycle.suspend(env.namespace, parents[i]))
        resume = await timed(rounds, lambda i: lifecycle.resume(env.namespace, parents[i]))
    finally:
        await store.postgres.close()
    suspend_floor, resume_floor = await bare_suspend_resume(env, parents, rounds)
    return [
        Figure("fork of a 10,000-event session p99", "ms", pct(fork, 0.99), pct(fork_floor, 0.99),
               Target.below_ms(200), higher_is_better=False, extra=latency_extra(fork, fork_floor)),
        Figure("suspend of a 10,000-event session p99", "ms", pct(suspend, 0.99), pct(suspend_floor, 0.99),
               Target.below_ms(1000), higher_is_better=False, extra=latency_extra(suspend, suspend_floor)),
        Figure("resume of a 10,000-event session p99", "ms", pct(resume, 0.99), pct(resume_floor, 0.99),
               Target.below_ms(1000), higher_is_better=False, extra=latency_extra(resume, resume_floor)),
    ]


async def bare_copy(env: Env, sid: str, to: str) -> None:
    """The fork's floor: read every event, ZADD them under another key."""
    members = await env.redis.zrange(keys.session_keys(env.namespace, sid).events, 0, -1, withscores=True)
    await env.redis.zadd(keys.session_keys(env.namespace, to).events, dict(cast(list[tuple[str, float]], members)))
    await env.redis.delete(keys.session_keys(env.namespace, to).events)


async def bare_suspend_resume(env: Env, parents: list[str], rounds: int) -> tuple[Samples, Samples]:
    """The floors: events read and one jsonb row written (suspend); the row read and the events ZADDed (resume)."""
    conn = await asyncpg.connect(env.postgres_dsn)
    await conn.execute("CREATE TEMP TABLE bare_rows (k text PRIMARY KEY, events jsonb)")

    async def suspend(i: int) -> None:
        members = await env.redis.zrange(keys.session_keys(env.namespace, parents[i]).events, 0, -1)
        await conn.execute("INSERT INTO bare_rows VALUES ($1, $2::jsonb)", f"r{i}", json.dumps(members))

    async def resume(i: int) -> None:
        members = json.loads(await conn.fetchval("SELECT events::text FROM bare_rows WHERE k = $1", f"r{i}"))
        key = keys.session_keys(env.namespace, f"bare-resume-{i}").events
        await env.redis.zadd(key, {member: n for n, member in enumerate(members, 1)})
        await env.redis.delete(key)

    try:
        return await timed(rounds, suspend), await timed(rounds, resume)
    finally:
        await conn.close()
