"""Redis memory per stored event (beside the event's own bytes) and per idle session."""

from __future__ import annotations

import json

from bench.harness import PAYLOAD, Env, Figure, new_session
from memento_sessions.sessions.manager import event_body, iso, now_ms
from memento_sessions.sessions.models import EventIn


async def used_memory(env: Env) -> int:
    """Redis's used_memory in bytes."""
    return int((await env.redis.info("memory"))["used_memory"])


async def measure(env: Env) -> list[Figure]:
    """5,000 events in one session, then 1,000 empty sessions; bytes each."""
    manager = env.manager()
    sid = await new_session(env, manager)
    before = await used_memory(env)
    events = [EventIn.model_validate(PAYLOAD)] * 500
    for _ in range(10):
        await manager.emit_batch(env.who(), sid, events)
    per_event = (await used_memory(env) - before) / 5000
    before = await used_memory(env)
    for _ in range(1000):
        await manager.create(env.who())
    per_session = (await used_memory(env) - before) / 1000
    payload_bytes = len(event_body(events[0], "bench", json.dumps(sid), iso(now_ms()))) + 10
    return [Figure("Redis memory per stored event", "bytes", per_event, payload_bytes, higher_is_better=False),
            Figure("Redis memory per idle session", "bytes", per_session, None, higher_is_better=False)]
