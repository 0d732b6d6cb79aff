"""bridge.handoff and bridge.transitions over WebSocket on a 10,000-entity graph and 1,000-event sessions,
each beside the bare calls of the same Redis and graph work."""

from __future__ import annotations

import json
import random

from bench import cypher
from bench.harness import Env, Figure, Samples, Target, latency_extra, pct, stored_events, timed, ws
from bench.watch import quiet
from memento_sessions import keys
from memento_sessions.bridge.queries import HANDOFF_CONTEXT, TRANSITION_CONTEXT
from memento_sessions.bridge.timeline import breakages, touched
from memento_sessions.kg.fixture import generate
from memento_sessions.kg.graph import Graphs
from memento_sessions.kg.loader import parse_lines, upsert
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import EventIn

WORKING_SET = 200
SHAPE = "(10k-entity graph, 1k events)"


async def load_fixture(env: Env, entities: int) -> tuple[list[str], str]:
    """Load the generated codebase graph into the bench namespace; its entity ids and the graph's name."""
    records = list(generate(entities))
    nodes, edges = parse_lines(json.dumps(r) for r in records)
    async with env.backends() as backends:
        graph = await Graphs(backends).get(env.namespace)
        await upsert(graph, nodes, edges)
    return [n.id for n in nodes if n.labels == ["CodebaseEntity"]], graph.name


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


async def measure(env: Env) -> list[Figure]:
    """bridge.handoff and bridge.transitions p99s.

    transitions twice: repeat calls on one session (the daemon's event cache then reads and decodes no
    event again), and the first call on each of many like sessions (every event read and decoded).
    """
    entity_ids, graph_name = await load_fixture(env, 10_000)
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
    floors = await bridge_floors(env, graph_name, sid, count, firsts)
    return [Figure(f"bridge.handoff p99 {SHAPE}", "ms", pct(handoff, 0.99), pct(floors[0], 0.99),
                   Target.below_ms(10), higher_is_better=False, extra=latency_extra(handoff, floors[0])),
            Figure(f"bridge.transitions p99, repeat calls {SHAPE}", "ms", pct(transitions, 0.99),
                   pct(floors[1], 0.99), Target.below_ms(20), higher_is_better=False,
                   extra=latency_extra(transitions, floors[1])),
            Figure(f"bridge.transitions p99, first call {SHAPE}", "ms", pct(cold, 0.99), pct(floors[2], 0.99),
                   Target.below_ms(20), higher_is_better=False,
                   extra={**latency_extra(cold, floors[2]), "sessions": firsts})]


async def bridge_session(env: Env, manager: SessionManager, events: list[EventIn]) -> str:
    """A new session holding `events`, written 500 at a time."""
    sid = str((await manager.create(env.who()))["sessionId"])
    for start in range(0, len(events), 500):
        await manager.emit_batch(env.who(), sid, events[start:start + 500])
    return sid


async def bridge_floors(env: Env, graph_name: str, sid: str, count: int,
                        firsts: int) -> tuple[Samples, Samples, Samples]:
    """Bare calls of the same Redis and graph work: the session reads and the same Cypher with the same ids.

    Repeat transitions read the session and the events after the last one seen (none: the session is
    idle); a first call reads every event.
    """
    skeys = keys.session_keys(env.namespace, sid)
    events = await stored_events(env, sid)
    recent_ids = touched(events[-10:])
    window_ids = list({e: None for b in breakages(events) for e in b.window})
    last_seq = events[-1]["seq"]

    async def handoff(_: int) -> None:
        await env.redis.hgetall(skeys.session)
        await env.redis.zrevrangebyscore(skeys.events, "+inf", "-inf", start=0, num=10)
        await env.falkordb.execute_command(  # type: ignore[no-untyped-call]
            "GRAPH.RO_QUERY", graph_name, cypher.query(HANDOFF_CONTEXT, {"ids": recent_ids}), "--compact")

    async def transitions(since: int) -> None:
        await env.redis.hgetall(skeys.session)
        await env.redis.zrangebyscore(skeys.events, f"({since}", "+inf")
        await env.falkordb.execute_command(  # type: ignore[no-untyped-call]
            "GRAPH.RO_QUERY", graph_name, cypher.query(TRANSITION_CONTEXT, {"ids": window_ids}), "--compact")

    return (await timed(count, handoff), await timed(count, lambda _: transitions(last_seq)),
            await timed(firsts, lambda _: transitions(0)))
