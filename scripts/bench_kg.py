"""Checkpoint and bridge latencies for scripts/bench.py, each beside the bare calls of the same backend work."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from memento_sessions import keys
from memento_sessions.backends import open_backends
from memento_sessions.bridge.queries import HANDOFF_CONTEXT, TRANSITION_CONTEXT
from memento_sessions.bridge.timeline import breakages, touched
from memento_sessions.checkpoints.aggregate import aggregate
from memento_sessions.checkpoints.anchors import WRITE_ANCHOR, anchor_props
from memento_sessions.checkpoints.checkpointer import Checkpointer
from memento_sessions.kg.fixture import generate
from memento_sessions.kg.graph import Graphs
from memento_sessions.kg.loader import parse_lines, upsert
from memento_sessions.sessions.manager import now_ms
from memento_sessions.sessions.models import EventIn
from memento_sessions.settings import load_settings

if TYPE_CHECKING:
    from bench import Env, Figure

Samples = list[float]
WORKING_SET = 200


async def timed(count: int, work: Callable[[int], Awaitable[Any]]) -> Samples:
    """Milliseconds of each of `count` sequential calls of `work`."""
    samples = []
    for i in range(count):
        start = time.perf_counter()
        await work(i)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def window(i: int) -> list[EventIn]:
    """Ten events on ten entities, the last one breaking the build."""
    events = [EventIn.model_validate({"type": "modified", "changeInfo": {"entityIds": [f"fn:cp{i}-{n}"]},
                                      "impact": {"severity": "high", "perfDelta": 1.5}}) for n in range(9)]
    events.append(EventIn.model_validate({"type": "broke", "changeInfo": {"entityIds": [f"fn:cp{i}-9"]}}))
    return events


async def bench_checkpoint(env: Env) -> Figure:
    """In-process Checkpointer.checkpoint of a 10-event, 10-entity, broken window (anchors + snapshot)."""
    from bench import Figure, pct, quiet

    count = 60 if env.quick else 300
    settings = load_settings(redis_url=env.redis_url, postgres_dsn=env.postgres_dsn, auth_secret="x" * 32,
                             checkpoint_every=100_000)
    async with open_backends(settings, env.redis_url, env.postgres_dsn) as backends:
        manager = env.manager()
        checkpointer = Checkpointer(settings, backends, manager)
        await checkpointer.snapshots.migrate()
        sids = [await ready_session(env, manager, window(i)) for i in range(count)]
        await quiet(env)
        ours = await timed(count, lambda i: checkpointer.checkpoint(env.namespace, sids[i]))
        floor = await checkpoint_floor(env, backends, [await ready_session(env, manager, window(i + count))
                                                       for i in range(count)])
    return Figure("checkpoint p99 (10 entities, broken: anchors + snapshot)", "ms", pct(ours, 0.99),
                  pct(floor, 0.99), "p99 < 20 ms", higher_is_better=False,
                  extra={"p50_ms": pct(ours, 0.5), "floor_p50_ms": pct(floor, 0.5)})


async def ready_session(env: Env, manager: Any, events: list[EventIn]) -> str:
    sid = str((await manager.create(env.who()))["sessionId"])
    await manager.emit_batch(env.who(), sid, events)
    return sid


async def checkpoint_floor(env: Env, backends: Any, sids: list[str]) -> Samples:
    """The same backend work by bare calls: ZRANGE, the anchor Cypher, a JSONB insert, FCALL ms_checkpoint."""
    graph = (await Graphs(backends).get(env.namespace))
    conn = await asyncpg.connect(env.postgres_dsn)
    await conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, events jsonb)")

    async def bare(i: int) -> None:
        skeys = keys.session_keys(env.namespace, sids[i])
        members = await env.redis.zrangebyscore(skeys.events, "-inf", "+inf")
        events = [json.loads(m) for m in members]
        summary = aggregate(events, "broken")
        await env.redis.execute_command("GRAPH.QUERY", graph.name, build_query(WRITE_ANCHOR, {
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


def build_query(query: str, params: dict[str, Any]) -> str:
    """A parameterised FalkorDB query as the client library sends it: `CYPHER k=v ... <query>`."""
    return "CYPHER " + " ".join(f"{k}={cypher_literal(v)}" for k, v in params.items()) + " " + query


def cypher_literal(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {cypher_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(cypher_literal(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


async def load_fixture(env: Env, entities: int) -> list[str]:
    """Load the generated codebase graph into the bench namespace; return its entity ids."""
    records = list(generate(entities))
    nodes, edges = parse_lines(json.dumps(r) for r in records)
    settings = load_settings(redis_url=env.redis_url, postgres_dsn=env.postgres_dsn, auth_secret="x" * 32)
    async with open_backends(settings, env.redis_url, env.postgres_dsn) as backends:
        await upsert(await Graphs(backends).get(env.namespace), nodes, edges)
    return [n.id for n in nodes if n.labels == ["CodebaseEntity"]]


def session_events(entity_ids: list[str], count: int) -> list[EventIn]:
    """A 1,000-event session: two edits per event within a working set of 200 graph entities (a task's
    neighbourhood), a break every 20 events, fixed by the next; 50 breakages in all."""
    rng = random.Random(11)
    entity_ids = rng.sample(entity_ids, WORKING_SET)
    events = []
    for i in range(count):
        kind = "broke" if i % 20 == 19 else ("test_pass" if i % 20 == 0 else "modified")
        events.append(EventIn.model_validate({"type": kind, "changeInfo": {
            "entityIds": rng.sample(entity_ids, 2)}, "impact": {"perfDelta": rng.uniform(-2, 2)}}))
    return events


async def bench_bridge(env: Env) -> list[Figure]:
    """bridge.handoff and bridge.transitions over WebSocket, 10,000-entity graph, 1,000-event sessions.

    transitions twice: repeat calls on one session (the daemon's event cache then reads and decodes no
    event again), and the first call on each of many like sessions (every event read and decoded).
    """
    from bench import Figure, pct, quiet, ws

    entity_ids = await load_fixture(env, 10_000)
    manager = env.manager()
    events = session_events(entity_ids, 1000)
    count, firsts = (100, 20) if env.quick else (500, 200)
    sids = [await bridge_session(env, manager, events) for _ in range(firsts + 1)]
    sid = sids.pop()
    await quiet(env)  # 200,000 events were just written: Redis may be rewriting its AOF
    async with ws(env, "bridge-reader") as peer:
        handoff = await timed(count, lambda _: peer.call("bridge.handoff", {"sessionId": sid}))
        transitions = await timed(count, lambda _: peer.call("bridge.transitions", {"sessionId": sid}))
        cold = await timed(firsts, lambda i: peer.call("bridge.transitions", {"sessionId": sids[i]}))
    await quiet(env)
    floors = await bridge_floors(env, sid, count, firsts)
    shape = "(10k-entity graph, 1k events)"
    return [Figure(f"bridge.handoff p99 {shape}", "ms", pct(handoff, 0.99),
                   pct(floors[0], 0.99), "p99 < 10 ms", higher_is_better=False,
                   extra={"p50_ms": pct(handoff, 0.5), "floor_p50_ms": pct(floors[0], 0.5)}),
            Figure(f"bridge.transitions p99, repeat calls {shape}", "ms", pct(transitions, 0.99),
                   pct(floors[1], 0.99), "p99 < 20 ms", higher_is_better=False,
                   extra={"p50_ms": pct(transitions, 0.5), "floor_p50_ms": pct(floors[1], 0.5)}),
            Figure(f"bridge.transitions p99, first call {shape}", "ms", pct(cold, 0.99),
                   pct(floors[2], 0.99), "p99 < 20 ms", higher_is_better=False,
                   extra={"p50_ms": pct(cold, 0.5), "floor_p50_ms": pct(floors[2], 0.5), "sessions": firsts})]


async def bridge_session(env: Env, manager: Any, events: list[EventIn]) -> str:
    sid = str((await manager.create(env.who()))["sessionId"])
    for start in range(0, len(events), 500):
        await manager.emit_batch(env.who(), sid, events[start:start + 500])
    return sid


async def bridge_floors(env: Env, sid: str, count: int, firsts: int) -> tuple[Samples, Samples, Samples]:
    """Bare calls of the same Redis and graph work: the session reads and the same Cypher with the same ids.

    Repeat transitions read the session and the events after the last one seen (none: the session is
    idle); a first call reads every event.
    """
    skeys = keys.session_keys(env.namespace, sid)
    graph_name = f"memento_{env.namespace}"
    events = [json.loads(m) for m in await env.redis.zrangebyscore(skeys.events, "-inf", "+inf")]
    recent_ids = touched(events[-10:])
    window_ids = list({e: None for b in breakages(events) for e in b.window})
    last_seq = events[-1]["seq"]

    async def handoff(_: int) -> None:
        await env.redis.hgetall(skeys.session)
        await env.redis.zrevrangebyscore(skeys.events, "+inf", "-inf", start=0, num=10)
        await env.redis.execute_command("GRAPH.RO_QUERY", graph_name,
                                        build_query(HANDOFF_CONTEXT, {"ids": recent_ids}), "--compact")

    async def transitions(since: int) -> None:
        await env.redis.hgetall(skeys.session)
        await env.redis.zrangebyscore(skeys.events, f"({since}", "+inf")
        await env.redis.execute_command("GRAPH.RO_QUERY", graph_name,
                                        build_query(TRANSITION_CONTEXT, {"ids": window_ids}), "--compact")

    return (await timed(count, handoff), await timed(count, lambda _: transitions(last_seq)),
            await timed(firsts, lambda _: transitions(0)))
