"""Ingest: event.emit in process (sequential, 64 concurrent, batched) and over WebSocket from 64 agents."""

from __future__ import annotations

import json

from bench.harness import PAYLOAD, Env, Figure, Target, concurrently, floor_args, new_session, rate
from bench.receivers import LeanCaller, masked_frame, upgraded
from memento_sessions import keys
from memento_sessions.redisio.pipe import Pipe
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import EventIn

AGENTS = 64


async def sequential(env: Env) -> Figure:
    """Also the same emits with MEMENTO_REDIS_SPIN_US=0 (the loop sleeps until each reply), for the spin's share."""
    manager = env.manager()
    await manager.start()
    n = 2000 if env.quick else 10000
    ours = await sequential_emits(env, manager, n)
    fkeys, fargs = floor_args(env, await new_session(env, manager))
    floor = await rate(n, lambda _: env.redis.fcall("ms_emit", 4, *fkeys, *fargs))
    sleeping = Pipe(env.redis_url, 0)
    spin_off = await sequential_emits(env, SessionManager(env.redis, manager.settings, sleeping), n)
    sleeping.close()
    return Figure("emit, in-process, sequential", "events/s", ours, floor,
                  Target.ratio_at_least(0.7, "bare FCALL"),
                  extra={"spin_us": manager.settings.redis_spin_us, "with_spin_off": spin_off})


async def sequential_emits(env: Env, manager: SessionManager, count: int) -> float:
    """Events per second of `count` emits one after another into a new session, each event validated."""
    sid = await new_session(env, manager)
    return await rate(count, lambda _: manager.emit(env.who(), sid, EventIn.model_validate(PAYLOAD)))


async def batch(env: Env) -> Figure:
    """emit_batch of 100 events beside 100 FCALLs pipelined."""
    manager = env.manager()
    batches = 40 if env.quick else 200
    sid = await new_session(env, manager)
    events = [EventIn.model_validate(PAYLOAD)] * 100
    ours = 100 * await rate(batches, lambda _: manager.emit_batch(env.who(), sid, events))
    fkeys, fargs = floor_args(env, await new_session(env, manager))

    async def pipelined(_: int) -> None:
        async with env.redis.pipeline(transaction=False) as pipe:
            for _ in range(100):
                pipe.fcall("ms_emit", 4, *fkeys, *fargs)
            await pipe.execute()

    floor = 100 * await rate(batches, pipelined)
    return Figure("emit_batch (100/batch), in-process", "events/s", ours, floor,
                  Target.ratio_at_least(0.7, "100 FCALLs pipelined"))


async def ws_ingest(env: Env) -> Figure:
    """64 agents, each on its own connection (opened before the clock starts), one event.emit at a time.

    The agents are lean clients (receivers.LeanCaller: one request frame built once, replies matched by
    position): 64 copies of a full client library in the bench's one process took as much CPU as the
    daemon they measured, on the same two vCPUs. The floor is redis-py's FCALL from 64 tasks on its
    pool, warmed to 64 connections first.
    """
    manager = env.manager()
    per_agent = 40 if env.quick else 150
    sid = await new_session(env, manager)
    callers = [await upgraded(env.port, env.token(f"agent{n}"), LeanCaller) for n in range(AGENTS)]
    frame = masked_frame(0x1, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "event.emit",
                                          "params": {"sessionId": sid, "event": PAYLOAD}}).encode())

    async def agent(n: int) -> None:
        for _ in range(per_agent):
            reply = await callers[n].call(frame)
            if b'"result"' not in reply:
                raise RuntimeError(f"event.emit failed: {reply[:200]!r}")

    ours = await concurrently(AGENTS, agent) * per_agent
    for caller in callers:
        assert caller.transport is not None
        caller.transport.close()
    stored = int(await env.redis.hget(keys.session_keys(env.namespace, sid).session, "seq") or 0)
    if stored != AGENTS * per_agent:
        raise RuntimeError(f"the session holds {stored} events, expected {AGENTS * per_agent}")
    await concurrently(AGENTS, lambda _: env.redis.ping())  # the pool opens its 64 connections untimed
    floor = await concurrent_fcalls(env, manager, per_agent)
    return Figure("event.emit over WebSocket, 64 agents", "events/s", ours, floor,
                  Target.ratio_at_least(0.5, "64 concurrent FCALLs"))


async def concurrent_fcalls(env: Env, manager: SessionManager, per_agent: int) -> float:
    """The floor of the 64-agent figures: 64 tasks each sending `per_agent` bare FCALLs into one new session."""
    fkeys, fargs = floor_args(env, await new_session(env, manager))

    async def floor_agent(_: int) -> None:
        for _ in range(per_agent):
            await env.redis.fcall("ms_emit", 4, *fkeys, *fargs)

    return await concurrently(AGENTS, floor_agent) * per_agent


async def concurrent(env: Env) -> Figure:
    """64 agents emitting in-process into one shared session at once (no WebSocket)."""
    manager = env.manager()
    await manager.start()
    per_agent = 40 if env.quick else 150
    sid, event = await new_session(env, manager), EventIn.model_validate(PAYLOAD)

    async def agent(n: int) -> None:
        who = env.who(f"agent{n}")
        for _ in range(per_agent):
            await manager.emit(who, sid, event)

    ours = await concurrently(AGENTS, agent) * per_agent
    floor = await concurrent_fcalls(env, manager, per_agent)
    return Figure("emit, in-process, 64 concurrent", "events/s", ours, floor)
