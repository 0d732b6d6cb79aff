"""What one daemon costs at scale: CPU beside a busy peer daemon, memory and CPU per idle
connection, deliveries per CPU-second.

CPU is the daemon process's own (/proc/<pid>/stat, daemons.cpu_seconds); the clients run in a crowd
process (crowd.py) or are lean clients in the bench's, never in the daemon's.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

import anyio

from bench.crowd import crowd
from bench.daemons import cpu_seconds, daemon, rss_kb
from bench.harness import PAYLOAD, Env, Figure, Target, new_session, paced
from bench.receivers import LeanCaller, LeanFlood, masked_frame, stamp, upgraded

BUSY_RATE = 5000  # events/s daemon A's clients emit
EMITTERS = 10  # A's clients, each on a session of its own, each pipelining 500 events/s
IDLE_CLIENTS = 100  # B's clients: each subscribed to a session nobody emits into, and watching the namespace
CENTRIFUGO_PER_CPU_S = 12_500  # deliveries per CPU-second in Centrifugo's published run (see docs/benchmarks.md)
CENTRIFUGO_KB = 27  # Centrifugo's published memory per idle connection, default build
FAN_SESSIONS, FAN_PER_SESSION, FAN_RATE = 10, 100, 10  # 10 sessions x 100 subscribers, each session 10 ev/s
IDLE_WINDOW = 20.0  # seconds of the density section's idle CPU window: one keepalive interval


def emit_frame(sid: str, data: dict[str, object] | None = None) -> bytes:
    """A masked `event.emit` request frame into `sid` (PAYLOAD, or an event with `data`)."""
    event = {"type": "modified", "data": data} if data is not None else PAYLOAD
    return masked_frame(0x1, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "event.emit",
                                         "params": {"sessionId": sid, "event": event}}).encode())


async def call_ok(caller: LeanCaller, frame: bytes) -> None:
    """One request; raises when the daemon answers with an error."""
    reply = await caller.call(frame)
    if b'"result"' not in reply:
        raise RuntimeError(f"event.emit failed: {reply[:200]!r}")


async def flood(floods: list[LeanFlood], sessions: list[str], seconds: float) -> int:
    """BUSY_RATE events/s for `seconds`: each tick, one pipelined event.emit per client into its own session;
    returns once every reply is in (raises on an error reply). The events sent."""
    frames = [emit_frame(sid) for sid in sessions]
    ticks = int(BUSY_RATE / len(floods) * seconds)

    async def tick() -> None:
        for client, frame in zip(floods, frames, strict=True):
            client.send_frame(frame)

    await paced(BUSY_RATE // len(floods), ticks, tick)
    with anyio.fail_after(60):
        for client in floods:
            await client.all_replied
    if errors := sum(client.errors for client in floods):
        raise RuntimeError(f"{errors} event.emit calls failed")
    return ticks * len(floods)


async def cross_daemon(env: Env) -> Figure:
    """Daemon B's CPU (its clients idle) while daemon A's clients emit 5,000 events/s, as a share of A's."""
    manager, window = env.manager(), 2.0 if env.quick else 4.0
    quiet_sessions = [await new_session(env, manager) for _ in range(IDLE_CLIENTS)]
    busy_sessions = [await new_session(env, manager) for _ in range(EMITTERS)]
    with tempfile.TemporaryDirectory(prefix="memento-bench-b-") as tmp:
        async with daemon(env.redis_url, env.postgres_dsn, Path(tmp), falkordb_url=env.falkordb_url) as b, crowd(
                {"kind": "ws", "count": IDLE_CLIENTS, "port": b.port, "namespace": env.namespace,
                 "sessions": quiet_sessions, "watch": True, "prefix": "idle"}) as idle:
            floods = [await upgraded(env.port, env.token(f"busy{n}"), LeanFlood) for n in range(EMITTERS)]
            await anyio.sleep(1)  # B's subscriptions, A's new agents' presence: all done before the windows
            b_quiet = cpu_seconds(b.pid)
            await anyio.sleep(window)  # B's own idle cost, with A idle too
            b_quiet = cpu_seconds(b.pid) - b_quiet
            a0, b0, started = cpu_seconds(env.daemon_pid), cpu_seconds(b.pid), time.perf_counter()
            sent = await flood(floods, busy_sessions, window)
            took = time.perf_counter() - started
            a_cpu, b_cpu = cpu_seconds(env.daemon_pid) - a0, cpu_seconds(b.pid) - b0
            close_all(floods)
            got = await idle.stop()
    return Figure("cross-daemon: idle daemon B's CPU / busy daemon A's", "%", 100 * b_cpu / a_cpu, None,
                  Target.under(5, "%"), higher_is_better=False,
                  extra={"a_cpu_s": a_cpu, "b_cpu_s": b_cpu, "a_events_per_s": sent / took, "window_s": took,
                         "b_core_pct": 100 * b_cpu / took, "b_core_pct_both_idle": 100 * b_quiet / window,
                         "b_clients": idle.opened, "b_deliveries": got})


def close_all(clients: list[LeanFlood]) -> None:
    """Close the clients' sockets."""
    for client in clients:
        if client.transport is not None:
            client.transport.close()


async def density(env: Env) -> list[Figure]:
    """10,000 idle authenticated WebSocket connections (2,000 with --quick): RSS growth each, idle CPU.

    The CPU window is one keepalive interval (20 s, MEMENTO_WS_PING_INTERVAL's default): every connection is
    pinged once in it and the presence heartbeat beats four times, so the figure does not depend on which of
    the periodic passes a shorter window happens to catch.
    """
    wanted, window = (2000, 5.0) if env.quick else (10_000, IDLE_WINDOW)
    before, cpu, started = rss_kb(env.daemon_pid), cpu_seconds(env.daemon_pid), time.perf_counter()
    async with crowd({"kind": "ws", "count": wanted, "port": env.port, "namespace": env.namespace,
                      "prefix": "dense"}) as idle:
        opened_in, open_cpu = time.perf_counter() - started, cpu_seconds(env.daemon_pid) - cpu
        if idle.error:
            print(f"bench: density: opened {idle.opened} of {wanted}: {idle.error}", file=sys.stderr, flush=True)
        await anyio.sleep(1)  # the last accepts settle
        grown = rss_kb(env.daemon_pid) - before
        cpu = cpu_seconds(env.daemon_pid)
        await anyio.sleep(window)
        idle_share = 100 * (cpu_seconds(env.daemon_pid) - cpu) / window
    opened = max(idle.opened, 1)
    extra = {"connections": float(idle.opened), "open_s": opened_in, "open_cpu_ms_each": 1000 * open_cpu / opened,
             "rss_growth_mb": grown / 1024}
    return [Figure(f"memory per idle WebSocket connection ({idle.opened:,} open)", "KB", grown / opened,
                   CENTRIFUGO_KB, Target.under(30, "KB"), higher_is_better=False, extra=extra),
            Figure(f"daemon CPU with {idle.opened:,} idle connections, {window:g} s", "% of a core", idle_share,
                   None, Target.under(5, "% of a core"), higher_is_better=False)]


async def deliveries(env: Env) -> Figure:
    """Deliveries per daemon CPU-second: 1,000 subscribers (10 sessions x 100), each session at 10 ev/s.

    The events are `event.emit`s on the same daemon (one lean client), so its CPU holds the emits too, as
    a publisher's API calls are in Centrifugo's figure.
    """
    manager, window = env.manager(), 3.0 if env.quick else 6.0
    sids = [await new_session(env, manager) for _ in range(FAN_SESSIONS)]
    count = int(FAN_RATE * FAN_SESSIONS * window)
    async with crowd({"kind": "ws", "count": FAN_SESSIONS * FAN_PER_SESSION, "port": env.port,
                      "namespace": env.namespace, "sessions": sids, "prefix": "fan"}) as fans:
        caller = await upgraded(env.port, env.token("fan-emitter"), LeanCaller)
        turn = itertools.count()
        await anyio.sleep(1)  # the subscriptions' replays are done before the window
        cpu = cpu_seconds(env.daemon_pid)
        await paced(FAN_RATE * FAN_SESSIONS, count,
                    lambda: call_ok(caller, emit_frame(sids[next(turn) % FAN_SESSIONS], {"t0": stamp()})))
        await anyio.sleep(0.5)  # the last event's deliveries go out
        cpu = cpu_seconds(env.daemon_pid) - cpu
        assert caller.transport is not None
        caller.transport.close()
        got = await fans.stop()
    expected = count * FAN_PER_SESSION * fans.opened / (FAN_SESSIONS * FAN_PER_SESSION)
    redis_got, redis_cpu = await redis_deliveries(env, window)
    return Figure(f"deliveries per daemon CPU-second, {fans.opened:,} subscribers, 10 sessions x 10 ev/s",
                  "deliveries/CPU-s", got / cpu, CENTRIFUGO_PER_CPU_S,
                  Target.ratio_at_least(1, "Centrifugo's ~12,500"),
                  extra={"delivered": got, "expected": expected, "daemon_cpu_s": cpu,
                         "redis_bare_per_cpu_s": redis_got / redis_cpu if redis_cpu else 0.0})


async def redis_deliveries(env: Env, window: float) -> tuple[int, float]:
    """The same shape on bare Redis pub/sub (10 channels x 100 bare subscribers apart, PUBLISH at 10/s each):
    the messages delivered and Redis's CPU seconds, so the kernel's share of a delivery shows."""
    pid = int((await env.redis.info("server"))["process_id"])
    channels = [f"bench-fan-{n}-{time.time_ns()}" for n in range(FAN_SESSIONS)]
    count, turn = int(FAN_RATE * FAN_SESSIONS * window), itertools.count()
    async with crowd({"kind": "pubsub", "count": FAN_SESSIONS * FAN_PER_SESSION, "url": env.subscriber_url,
                      "channels": channels}) as fans:
        await anyio.sleep(1)
        cpu = cpu_seconds(pid)
        await paced(FAN_RATE * FAN_SESSIONS, count, lambda: env.redis.publish(
            channels[next(turn) % FAN_SESSIONS], str(time.perf_counter_ns())))
        await anyio.sleep(0.5)
        cpu = cpu_seconds(pid) - cpu
        return await fans.stop(), cpu
