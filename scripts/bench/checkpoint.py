"""Checkpoint latency: Checkpointer.checkpoint in process, beside the bare calls of the same backend work."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import asyncpg

from bench import cypher
from bench.harness import Env, Figure, Samples, Target, latency_extra, pct, stored_events, timed
from bench.watch import quiet
from memento_sessions import keys
from memento_sessions.checkpoints.aggregate import aggregate
from memento_sessions.checkpoints.anchors import WRITE_ANCHOR, anchor_props
from memento_sessions.checkpoints.checkpointer import Checkpointer
from memento_sessions.checkpoints.snapshots import Snapshots
from memento_sessions.kg.graph import Graphs
from memento_sessions.sessions.manager import SessionManager, now_ms
from memento_sessions.sessions.models import EventIn


def window(i: int) -> list[EventIn]:
    """Ten events on ten entities, the last one breaking the build."""
    events = [EventIn.model_validate({"type": "modified", "changeInfo": {"entityIds": [f"fn:cp{i}-{n}"]},
                                      "impact": {"severity": "high", "perfDelta": 1.5}}) for n in range(9)]
    events.append(EventIn.model_validate({"type": "broke", "changeInfo": {"entityIds": [f"fn:cp{i}-9"]}}))
    return events


async def measure(env: Env) -> Figure:
    """In-process Checkpointer.checkpoint of a 10-event, 10-entity, broken window (anchors + snapshot)."""
    count = 60 if env.quick else 300
    settings = env.settings(checkpoint_every=100_000)
    async with env.backends(settings) as backends:
        manager = env.manager()
        graphs = Graphs(backends)
        checkpointer = Checkpointer(settings, backends, manager, graphs, Snapshots(backends.postgres))
        await checkpointer.snapshots.migrate()
        sids = [await ready_session(env, manager, window(i)) for i in range(count)]
        await quiet(env)
        ours = await timed(count, lambda i: checkpointer.checkpoint(env.namespace, sids[i]))
        floor = await checkpoint_floor(env, graphs, [await ready_session(env, manager, window(i + count))
                                                       for i in range(count)])
    return Figure("checkpoint p99 (10 entities, broken: anchors + snapshot)", "ms", pct(ours, 0.99),
                  pct(floor, 0.99), Target.below_ms(20), higher_is_better=False, extra=latency_extra(ours, floor))


async def ready_session(env: Env, manager: SessionManager, events: list[EventIn]) -> str:
    """A new session holding `events`."""
    sid = str((await manager.create(env.who()))["sessionId"])
    await manager.emit_batch(env.who(), sid, events)
    return sid


async def checkpoint_floor(env: Env, graphs: Graphs, sids: list[str]) -> Samples:
    """The same backend work by bare calls: ZRANGE, the anchor Cypher, a JSONB insert, FCALL ms_checkpoint."""
    graph = await graphs.get(env.namespace)
    conn = await asyncpg.connect(env.postgres_dsn)
    await conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, events jsonb)")

    async def bare(i: int) -> None:
        skeys = keys.session_keys(env.namespace, sids[i])
        events = await stored_events(env, sids[i])
        summary = aggregate(events, "broken")
        await env.falkordb.execute_command(  # type: ignore[no-untyped-call]
            "GRAPH.QUERY", graph.name, cypher.query(WRITE_ANCHOR, {
                "checkpointId": f"floor-{sids[i]}", "entityIds": list(summary.entity_ids), "cap": 5,
                "props": anchor_props(sids[i], summary, datetime.now(UTC), None)}), "--compact")
        await conn.execute("INSERT INTO bench_floor (events) VALUES ($1::jsonb)", json.dumps(events))
        await env.redis.fcall("ms_checkpoint", 4, *skeys.all(), now_ms(), "{}", "0", 300,
                              keys.session_channel(env.namespace, sids[i]), "{}",
                              keys.announce_channel(env.namespace), "{}")

    try:
        return await timed(len(sids), bare)
    finally:
        await conn.close()
