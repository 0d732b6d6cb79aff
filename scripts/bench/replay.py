"""Replay: session.subscribe since 0 on 10,000 stored events, beside the bare chunked ZRANGEBYSCOREs."""

from __future__ import annotations

import time

from bench.harness import PAYLOAD, Env, Figure, Target, new_session, rate, ws
from memento_sessions import keys
from memento_sessions.sessions.models import EventIn

EVENTS, CHUNK = 10_000, 500


async def measure(env: Env) -> Figure:
    """Events per second a subscriber receives while the daemon replays the whole session."""
    manager = env.manager()
    sid = await new_session(env, manager)
    events = [EventIn.model_validate(PAYLOAD)] * CHUNK
    for _ in range(EVENTS // CHUNK):
        await manager.emit_batch(env.who(), sid, events)
    async with ws(env, "replayer") as peer:
        start = time.perf_counter()
        await peer.call("session.subscribe", {"sessionId": sid, "since": 0})
        got = 0
        while got < EVENTS:
            if '"session.event"' in (await peer.ws.recv())[:60]:
                got += 1
        ours = EVENTS / (time.perf_counter() - start)
    zkey = keys.session_keys(env.namespace, sid).events

    async def chunked(_: int) -> None:
        for start_seq in range(0, EVENTS, CHUNK):
            await env.redis.zrangebyscore(zkey, f"({start_seq}", "+inf", start=0, num=CHUNK)

    floor = EVENTS * await rate(1, chunked)
    return Figure("replay, subscribe since 0 on 10,000 events", "events/s", ours, floor,
                  Target.at_least(50_000, "events/s"), extra={"floor_is": 0})
