#!/usr/bin/env python3
"""memento-sessions benchmark: every hot path beside the raw floor, measured in one run.

Starts the embedded redis-server (with FalkorDB) and Postgres in a temporary directory and a
daemon process on them, then measures each figure and the bare redis-py call of the same Redis
work (the floor) side by side, and prints a table and one JSON line.

    .venv/bin/python scripts/bench.py            # full run (a few minutes)
    .venv/bin/python scripts/bench.py --quick    # under a minute
    .venv/bin/python scripts/bench.py --peers    # also the peers, on the same Redis and Postgres

With --peers, the OpenAI Agents SDK and Google ADK are installed from PyPI into their own
virtualenv (.bench-peers-venv/, made once and reused; never the project's), and
scripts/bench_peers.py runs there against this run's servers. Their rows show memento's figure as
the value and the peer's as the floor, so the ratio is memento / peer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_kg
from bench_receivers import LeanCaller, lean_pubsub, lean_subscriber, masked_frame, since_stamp_ms, stamp, upgraded

from memento_sessions import keys
from memento_sessions.auth import Identity, issue_token
from memento_sessions.embedded.postgres import EmbeddedPostgres
from memento_sessions.embedded.process import free_port
from memento_sessions.embedded.redis import EmbeddedRedis
from memento_sessions.logs import configure_logging
from memento_sessions.redisio.pipe import Pipe
from memento_sessions.server.daemon import settle_gc
from memento_sessions.sessions.manager import SessionManager, event_body, iso, now_ms
from memento_sessions.sessions.models import EventIn
from memento_sessions.settings import load_settings

SECRET = "bench-secret-0123456789-0123456789-abcdef"
PAYLOAD: dict[str, Any] = {
    "type": "modified",
    "changeInfo": {"elementType": "function", "entityIds": ["fn:parse_config", "fn:load"], "operation": "modified",
                   "affectedLines": 12},
    "impact": {"severity": "low", "perfDelta": -0.5},
}


@dataclass
class Figure:
    """One measured figure beside its floor."""

    name: str
    unit: str
    value: float
    floor: float | None
    target: str = ""
    higher_is_better: bool = True
    met: bool | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if not self.floor:
            return None
        return self.value / self.floor


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Env:
    """What every measurement needs: the backends, the daemon's port, a Redis client."""

    redis_url: str
    postgres_dsn: str
    port: int
    redis: aioredis.Redis
    quick: bool
    namespace: str = "bench"
    pipe: Pipe | None = None

    def token(self, agent: str) -> str:
        return issue_token(SECRET, agent, self.namespace, "sessions:read sessions:write kg:write", 3600)

    def manager(self) -> SessionManager:
        """A SessionManager wired as the daemon wires it (Function calls on the auto-pipelined connection)."""
        settings = load_settings(redis_url=self.redis_url, postgres_dsn=self.postgres_dsn, auth_secret=SECRET)
        if self.pipe is None:
            self.pipe = Pipe(self.redis_url, settings.redis_spin_us)
        return SessionManager(self.redis, settings, self.pipe)

    def who(self, agent: str = "bench") -> Identity:
        return Identity(agent, self.namespace, frozenset({"sessions:read", "sessions:write"}))


class Rpc:
    """A minimal JSON-RPC WebSocket peer (one request at a time)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(await self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return reply["result"]


@asynccontextmanager
async def ws(env: Env, agent: str) -> AsyncIterator[Rpc]:
    async with connect(f"ws://127.0.0.1:{env.port}/ws?token={env.token(agent)}", max_size=2**24,
                       max_queue=None, compression=None) as conn:
        yield Rpc(conn)


async def rate(count: int, work: Callable[[int], Awaitable[None]]) -> float:
    """Operations per second of `count` sequential calls of `work`."""
    start = time.perf_counter()
    for i in range(count):
        await work(i)
    return count / (time.perf_counter() - start)


async def quiet(env: Env) -> None:
    """Wait (up to 60 s) until Redis is neither rewriting its AOF nor saving an RDB.

    Redis rewrites the AOF each time it doubles past 64 MB (about every 100,000 events here: ~520 bytes
    of AOF per event), in a forked child that keeps one of the two vCPUs busy for a second or more. A
    figure timed beside one measures that contention, so each timed part starts on a quiet server;
    the waits are printed.
    """
    started, polls = time.perf_counter(), 0
    with anyio.fail_after(60):
        while True:
            stats = await env.redis.info("persistence")
            if not stats.get("aof_rewrite_in_progress") and not stats.get("rdb_bgsave_in_progress"):
                break
            polls += 1
            await anyio.sleep(0.05)
    if polls:
        waited = time.perf_counter() - started
        print(f"bench: waited {waited:.2f} s for Redis's AOF rewrite to finish", file=sys.stderr, flush=True)


async def daemon_gc(env: Env) -> dict[str, tuple[float, float, float]]:
    """The daemon's collector pauses so far, from its /metrics: per generation (count, total s, count > 5 ms)."""
    stream = await anyio.connect_tcp("127.0.0.1", env.port)
    async with stream:
        await stream.send(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        raw = b""
        with anyio.move_on_after(5):
            while True:
                try:
                    raw += await stream.receive()
                except anyio.EndOfStream:
                    break
    pauses: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(raw.partition(b"\r\n\r\n")[2].decode()):
        if family.name != "memento_gc_pause_seconds":
            continue
        for sample in family.samples:
            found = pauses.setdefault(sample.labels["generation"], [0.0, 0.0, 0.0, 0.0])
            if sample.name.endswith("_count"):
                found[0] = sample.value
            elif sample.name.endswith("_sum"):
                found[1] = sample.value
            elif sample.labels.get("le") == "0.005":
                found[3] = sample.value
    return {gen: (count, total, count - within) for gen, (count, total, _, within) in pauses.items()}


def gc_note(before: dict[str, tuple[float, float, float]], after: dict[str, tuple[float, float, float]]) -> str:
    """`gen0 12 (3.1 ms), gen2 1 (41.0 ms, 1 over 5 ms)`: the daemon's pauses between two readings."""
    parts = []
    for gen in sorted(after):
        count, total, slow = (a - b for a, b in zip(after[gen], before.get(gen, (0.0, 0.0, 0.0)), strict=True))
        if count:
            parts.append(f"gen{gen} {count:.0f} ({total * 1000:.1f} ms" + (f", {slow:.0f} over 5 ms)" if slow else ")"))
    return ", ".join(parts) or "none"


# --- ingest -------------------------------------------------------------------------------------------------


async def new_session(env: Env, manager: SessionManager) -> str:
    return str((await manager.create(env.who()))["sessionId"])


def floor_args(env: Env, sid: str, count: int = 1) -> tuple[list[str], list[str | int]]:
    """The exact FCALL ms_emit keys and args the manager sends for PAYLOAD."""
    event = EventIn.model_validate(PAYLOAD)
    stamp = iso(now_ms())
    args: list[str | int] = [now_ms(), "bench", keys.session_channel(env.namespace, sid), json.dumps(sid),
                             env.manager().settings.session_max_events]
    for _ in range(count):
        args += ["", event.new_state(), event_body(event, "bench", json.dumps(sid), stamp)]
    return keys.session_keys(env.namespace, sid).all(), args


async def bench_emit_sequential(env: Env) -> Figure:
    """Also the same emits with MEMENTO_REDIS_SPIN_US=0 (the loop sleeps until each reply), for the spin's share."""
    manager = env.manager()
    await manager.start()
    n = 2000 if env.quick else 10000
    ours = await sequential_emits(env, manager, n)
    floor_sid = await new_session(env, manager)
    fkeys, fargs = floor_args(env, floor_sid)
    floor = await rate(n, lambda _: env.redis.fcall("ms_emit", 4, *fkeys, *fargs))
    sleeping = Pipe(env.redis_url, 0)
    spin_off = await sequential_emits(env, SessionManager(env.redis, manager.settings, sleeping), n)
    sleeping.close()
    return Figure("emit, in-process, sequential", "events/s", ours, floor, ">= 0.7 x floor (bare FCALL)",
                  extra={"spin_us": manager.settings.redis_spin_us, "with_spin_off": spin_off})


async def sequential_emits(env: Env, manager: SessionManager, count: int) -> float:
    """Events per second of `count` emits one after another into a new session, each event validated."""
    sid = await new_session(env, manager)
    return await rate(count, lambda _: manager.emit(env.who(), sid, EventIn.model_validate(PAYLOAD)))


async def bench_emit_batch(env: Env) -> Figure:
    manager = env.manager()
    batches = 40 if env.quick else 200
    sid = await new_session(env, manager)
    events = [EventIn.model_validate(PAYLOAD)] * 100
    ours = 100 * await rate(batches, lambda _: manager.emit_batch(env.who(), sid, events))
    floor_sid = await new_session(env, manager)
    fkeys, fargs = floor_args(env, floor_sid)

    async def pipelined(_: int) -> None:
        async with env.redis.pipeline(transaction=False) as pipe:
            for _ in range(100):
                pipe.fcall("ms_emit", 4, *fkeys, *fargs)
            await pipe.execute()

    floor = 100 * await rate(batches, pipelined)
    return Figure("emit_batch (100/batch), in-process", "events/s", ours, floor,
                  ">= 0.7 x floor (100 FCALLs pipelined)")


async def bench_ws_ingest(env: Env) -> Figure:
    """64 agents, each on its own connection (opened before the clock starts), one event.emit at a time.

    The agents are lean clients (bench_receivers.LeanCaller: one request frame built once, replies
    matched by position): 64 copies of a full client library in the bench's one process took as much
    CPU as the daemon they measured, on the same two vCPUs. The floor is redis-py's FCALL from 64
    tasks on its pool, warmed to 64 connections first.
    """
    manager = env.manager()
    agents, per_agent = 64, (40 if env.quick else 150)
    sid = await new_session(env, manager)
    callers = [await upgraded(env.port, env.token(f"agent{n}"), LeanCaller) for n in range(agents)]
    frame = masked_frame(0x1, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "event.emit",
                                          "params": {"sessionId": sid, "event": PAYLOAD}}).encode())

    async def agent(n: int) -> None:
        for _ in range(per_agent):
            reply = await callers[n].call(frame)
            if b'"result"' not in reply:
                raise RuntimeError(f"event.emit failed: {reply[:200]!r}")

    ours = await concurrently(agents, agent) * per_agent
    for caller in callers:
        assert caller.transport is not None
        caller.transport.close()
    stored = int(await env.redis.hget(keys.session_keys(env.namespace, sid).session, "seq") or 0)
    if stored != agents * per_agent:
        raise RuntimeError(f"the session holds {stored} events, expected {agents * per_agent}")
    floor_sid = await new_session(env, manager)
    fkeys, fargs = floor_args(env, floor_sid)
    await concurrently(agents, lambda _: env.redis.ping())  # the pool opens its 64 connections untimed

    async def floor_agent(_: int) -> None:
        for _ in range(per_agent):
            await env.redis.fcall("ms_emit", 4, *fkeys, *fargs)

    floor = await concurrently(agents, floor_agent) * per_agent
    return Figure("event.emit over WebSocket, 64 agents", "events/s", ours, floor,
                  ">= 0.5 x floor (64 concurrent FCALLs)")


async def concurrently(n: int, work: Callable[[int], Awaitable[None]]) -> float:
    """Rounds per second: n tasks each doing `work` once, timed together."""
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(work, i)
    return n / (time.perf_counter() - start)


async def bench_emit_concurrent(env: Env) -> Figure:
    """64 agents emitting in-process into one shared session at once (no WebSocket)."""
    manager = env.manager()
    await manager.start()
    agents, per_agent = 64, (40 if env.quick else 150)
    sid, event = await new_session(env, manager), EventIn.model_validate(PAYLOAD)

    async def agent(n: int) -> None:
        who = env.who(f"agent{n}")
        for _ in range(per_agent):
            await manager.emit(who, sid, event)

    ours = await concurrently(agents, agent) * per_agent
    fkeys, fargs = floor_args(env, await new_session(env, manager))

    async def floor_agent(_: int) -> None:
        for _ in range(per_agent):
            await env.redis.fcall("ms_emit", 4, *fkeys, *fargs)

    floor = await concurrently(agents, floor_agent) * per_agent
    return Figure("emit, in-process, 64 concurrent", "events/s", ours, floor)


# --- fan-out --------------------------------------------------------------------------------------------------


async def receive_latencies(conn: ClientConnection, samples: list[float], count: int) -> None:
    """Record send-to-receive latency of `count` session.event frames carrying {"t0": ns}."""
    got = 0
    while got < count:
        frame = await conn.recv()
        now = time.perf_counter_ns()
        at = frame.find('"t0":')
        if at < 0 or '"session.event"' not in frame[:60]:
            continue
        t0 = int(frame[at + 5: frame.index("}", at)])
        samples.append(since_stamp_ms(now, t0))
        got += 1


async def handoff(env: Env, subscribers: int, per_second: int, count: int) -> list[list[float]]:
    """Per receiver, latency samples of event.emit (A) to session.event (B) at a fixed rate."""
    manager = env.manager()
    sid = await new_session(env, manager)
    samples: list[list[float]] = [[] for _ in range(subscribers)]
    receivers = [await lean_subscriber(env.port, env.token(f"sub{n}"), sid, samples[n], count)
                 for n in range(subscribers)]
    async with ws(env, "emitter") as emitter:
        await paced(per_second, count, lambda: emitter.call("event.emit", {
            "sessionId": sid, "event": {"type": "modified", "data": {"t0": stamp()}}}))
        await finish(receivers)
    return samples


async def finish(receivers: list[Any]) -> None:
    """Wait (bounded) for every receiver's last sample, then close them."""
    with anyio.move_on_after(30):
        for receiver in receivers:
            await receiver.done
    for receiver in receivers:
        receiver.transport.close()


async def paced(per_second: int, count: int, send: Callable[[], Awaitable[Any]]) -> None:
    """Call `send` `count` times at `per_second`, on a fixed schedule (no coordinated omission)."""
    start, interval = time.perf_counter(), 1.0 / per_second
    for i in range(count):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            await anyio.sleep(delay)
        await send()


async def publish_floor(env: Env, subscribers: int, per_second: int, count: int) -> list[list[float]]:
    """Per receiver, latency of a bare PUBLISH to bare RESP subscribers, same shape."""
    channel = f"bench-floor-{time.time_ns()}"
    samples: list[list[float]] = [[] for _ in range(subscribers)]
    receivers = [await lean_pubsub(env.redis_url, channel, samples[n], count) for n in range(subscribers)]
    await paced(per_second, count, lambda: env.redis.publish(channel, str(time.perf_counter_ns())))
    await finish(receivers)
    return samples


async def bench_handoff(env: Env, subscribers: int, per_second: int) -> Figure:
    count = max(50, per_second * (2 if env.quick else 8))
    ours = flat(await handoff(env, subscribers, per_second, count))
    floor = flat(await publish_floor(env, subscribers, per_second, count))
    return Figure(f"handoff p99, {per_second} ev/s, {subscribers} subscribers", "ms", pct(ours, 0.99),
                  pct(floor, 0.99), "p99 < 5 ms", higher_is_better=False,
                  extra={"p50_ms": pct(ours, 0.5), "floor_p50_ms": pct(floor, 0.5), "samples": len(ours)})


async def bench_fanout_1000(env: Env) -> Figure:
    subscribers, count = 1000, (20 if env.quick else 60)
    ours = await handoff(env, subscribers, 10, count)
    floor = await publish_floor(env, subscribers, 10, count)
    last_ours = per_event_max(ours, count)
    last_floor = per_event_max(floor, count)
    return Figure("fan-out to 1000 subscribers, 10 ev/s, last receiver p99", "ms", pct(last_ours, 0.99),
                  pct(last_floor, 0.99), "p99 < 50 ms", higher_is_better=False,
                  extra={"p50_ms": pct(last_ours, 0.5), "floor_p50_ms": pct(last_floor, 0.5)})


def per_event_max(by_receiver: list[list[float]], count: int) -> list[float]:
    """For each event, the latency of the last receiver to get it (each receiver's samples are in event order)."""
    return [max(row[i] for row in by_receiver if len(row) > i) for i in range(count)]


def flat(by_receiver: list[list[float]]) -> list[float]:
    return [sample for row in by_receiver for sample in row]


async def bench_replay(env: Env) -> Figure:
    manager = env.manager()
    n = 10_000
    sid = await new_session(env, manager)
    events = [EventIn.model_validate(PAYLOAD)] * 500
    for _ in range(n // 500):
        await manager.emit_batch(env.who(), sid, events)
    async with ws(env, "replayer") as peer:
        start = time.perf_counter()
        await peer.call("session.subscribe", {"sessionId": sid, "since": 0})
        got = 0
        while got < n:
            if '"session.event"' in (await peer.ws.recv())[:60]:
                got += 1
        ours = n / (time.perf_counter() - start)
    zkey = keys.session_keys(env.namespace, sid).events

    async def chunked(_: int) -> None:
        for start_seq in range(0, n, 500):
            await env.redis.zrangebyscore(zkey, f"({start_seq}", "+inf", start=0, num=500)

    floor = n * await rate(1, chunked)
    return Figure("replay, subscribe since 0 on 10,000 events", "events/s", ours, floor, ">= 50,000 events/s",
                  extra={"floor_is": 0})


# --- memory ---------------------------------------------------------------------------------------------------


async def used_memory(env: Env) -> int:
    return int((await env.redis.info("memory"))["used_memory"])


async def bench_memory(env: Env) -> list[Figure]:
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
    return [Figure("Redis memory per stored event", "bytes", per_event, payload_bytes, "", higher_is_better=False),
            Figure("Redis memory per idle session", "bytes", per_session, None, "", higher_is_better=False)]


# --- peers ----------------------------------------------------------------------------------------------------

PEERS_VENV = Path(__file__).resolve().parent.parent / ".bench-peers-venv"
PEERS_SCRIPT = Path(__file__).resolve().parent / "bench_peers.py"
# Pinned so that runs compare. SQLAlchemy and asyncpg by hand: ADK's "db" extra also pulls in Spanner. hiredis
# because the project's redis-py has it: the peer gets the same client and parser.
PEER_PACKAGES = ["openai-agents[redis]==0.24.0", "google-adk==2.13.0", "sqlalchemy[asyncio]>=2,<3", "asyncpg>=0.29",
                 "hiredis>=3"]
PEER_ROUNDS = 3  # sequential peer appends and memento's emits, alternated; each row takes the medians


def peers_venv() -> Path:
    """The python of the peers' own virtualenv, made or brought up to PEER_PACKAGES when needed."""
    python, marker = PEERS_VENV / "bin" / "python", PEERS_VENV / "memento-peers.txt"
    wanted = "\n".join(PEER_PACKAGES)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"bench: installing the peers into {PEERS_VENV} (minutes, once) ...", file=sys.stderr, flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--progress-bar", "off", *PEER_PACKAGES],
                   stdout=sys.stderr, check=True)
    marker.write_text(wanted)
    return python


async def bench_peers(env: Env, python: Path, figures: list[Figure]) -> list[Figure]:
    """The peers' appends on this run's Redis and Postgres, each beside memento's emit of this run.

    The VM's speed drifts by tens of percent within a minute, so the sequential rows alternate: a peer
    round, then memento's sequential emits, PEER_ROUNDS times (once with --quick), and compare medians.
    """
    print("bench: peers ...", file=sys.stderr, flush=True)
    manager, rounds = env.manager(), 1 if env.quick else PEER_ROUNDS
    peers, ours, sdk_seq, adk_seq, stolen = {}, [], [], [], steal_ms()
    for round_ in range(rounds):
        await quiet(env)
        found = await run_peers(env, python, concurrent=round_ == 0)
        peers = peers or found
        sdk_seq.append(found["agents_sdk"]["sequential_per_s"])
        adk_seq.append(found["adk"]["sequential_per_s"])
        await quiet(env)
        ours.append(await sequential_emits(env, manager, 2000 if env.quick else 5000))
    print(peers_note(peers, rounds))
    mine = {f.name: f.value for f in figures}
    rounds_of = {f"round{i + 1}": v for i, v in enumerate(ours)}
    rows = [Figure("memento / Agents SDK RedisSession.add_items, seq", "events/s", median(ours), median(sdk_seq),
                   ">= 5 x peer", extra={**rounds_of, **{f"peer_round{i + 1}": v for i, v in enumerate(sdk_seq)}}),
            Figure("memento / Agents SDK RedisSession.add_items, 64 agents", "events/s",
                   mine["emit, in-process, 64 concurrent"], peers["agents_sdk"]["concurrent_per_s"]),
            Figure("memento / ADK DatabaseSessionService.append_event, seq", "events/s", median(ours),
                   median(adk_seq), ">= 25 x peer",
                   extra={**rounds_of, **{f"peer_round{i + 1}": v for i, v in enumerate(adk_seq)}})]
    for row in rows:
        row.extra["section_steal_ms"] = steal_ms() - stolen
        judge(row)
    return rows


async def run_peers(env: Env, python: Path, concurrent: bool) -> dict[str, Any]:
    """One run of bench_peers.py in the peers' virtualenv: its JSON line."""
    seq, per_agent, adk = (300, 5, 200) if env.quick else (3000, 40, 1000)
    done = await anyio.run_process(
        [str(python), str(PEERS_SCRIPT), "--redis-url", env.redis_url,
         "--postgres-dsn", env.postgres_dsn, "--payload", json.dumps(PAYLOAD), "--sequential", str(seq),
         "--agents", "64" if concurrent else "0", "--per-agent", str(per_agent), "--adk-sequential", str(adk)],
        stderr=None)
    found: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return found


def median(values: list[float]) -> float:
    return statistics.median(values)


def peers_note(peers: dict[str, Any], rounds: int) -> str:
    """What each peer row measured, in words."""
    sdk, adk = peers["agents_sdk"], peers["adk"]
    return (f"peers (value = memento's in-process emit of this run, floor = the peer, ratio = memento / peer; "
            f"sequential rows: medians of {rounds} alternated rounds of the peer and memento's emits): "
            f"openai-agents {sdk['version']} {sdk['api']} ({sdk['client']}) with PAYLOAD as {sdk['payload_as']}, "
            f"{sdk['redis_commands_per_append']:g} Redis commands per append (memento: 1 FCALL), "
            f"{sdk['sequential_count']} sequential on one session, {sdk['concurrent_agents']} agents x "
            f"{sdk['concurrent_per_agent']} concurrent, {sdk['concurrent_shape']} (memento's: one shared session); "
            f"google-adk {adk['version']} {adk['api']} on {adk['driver']} with PAYLOAD as {adk['payload_as']}, "
            f"{adk['sql_statements_per_append']:g} SQL statements per append, "
            f"{adk['sequential_count']} sequential on one session.")


# --- driver ---------------------------------------------------------------------------------------------------


def judge(figure: Figure) -> None:
    """Set `met` from the target text."""
    t, ratio = figure.target, figure.ratio
    if t.startswith(">=") and ("x floor" in t or "x peer" in t) and ratio is not None:
        figure.met = ratio >= float(t.split()[1])
    elif t.startswith("p99 <"):
        figure.met = figure.value < float(t.split()[2])
    elif t.startswith(">=") and "events/s" in t:
        figure.met = figure.value >= float(t.split()[1].replace(",", ""))


def show(figures: list[Figure]) -> None:
    print(f"\n{'figure':<58} {'value':>12} {'floor':>12} {'ratio':>7}  target / met")
    for f in figures:
        floor = f"{f.floor:,.1f}" if f.floor else "-"
        ratio = f"{f.ratio:.2f}" if f.ratio else "-"
        met = {True: "yes", False: "NO", None: ""}[f.met]
        print(f"{f.name:<58} {f.value:>12,.2f} {floor:>12} {ratio:>7}  {f.target} {met}  [{f.unit}]")
        if f.extra:
            print(f"{'':<58} " + ", ".join(f"{k}={v:,.2f}" for k, v in f.extra.items() if k != "floor_is"))
    print(json.dumps({"bench": [{**asdict(f), "ratio": f.ratio} for f in figures]}))


@asynccontextmanager
async def daemon(redis_url: str, postgres_dsn: str, data: Path) -> AsyncIterator[int]:
    port = free_port()
    env = {**os.environ, "MEMENTO_REDIS_URL": redis_url, "MEMENTO_POSTGRES_DSN": postgres_dsn,
           "MEMENTO_AUTH_SECRET": SECRET, "MEMENTO_PORT": str(port), "MEMENTO_DATA_DIR": str(data / "daemon"),
           "MEMENTO_LOG_LEVEL": "warning", "MEMENTO_CHECKPOINT_EVERY": "100000"}
    proc = subprocess.Popen([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env)
    try:
        await wait_port(port)
        yield port
    finally:
        proc.terminate()
        proc.wait(15)


async def wait_port(port: int) -> None:
    with anyio.fail_after(60):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
                await stream.aclose()
                return
            except OSError:
                await anyio.sleep(0.1)


SECTIONS: dict[str, Callable[[Env], Awaitable[Figure | list[Figure]]]] = {
    "emit": bench_emit_sequential,
    "emit-64": bench_emit_concurrent,
    "batch": bench_emit_batch,
    "ws-ingest": bench_ws_ingest,
    "handoff-100": lambda env: bench_handoff(env, 100, 100),
    "handoff-1000": lambda env: bench_handoff(env, 10, 1000),
    "fanout-1000": bench_fanout_1000,
    "replay": bench_replay,
    "memory": bench_memory,
    "checkpoint": lambda env: bench_kg.bench_checkpoint(env),
    "bridge": lambda env: bench_kg.bench_bridge(env),
}


async def run(args: argparse.Namespace) -> None:
    configure_logging("console", "warning")
    peers = peers_venv() if args.peers else None  # before the servers: the install is not timed
    with tempfile.TemporaryDirectory(prefix="memento-bench-") as tmp:
        data = Path(tmp)
        redis_server, postgres = EmbeddedRedis(data / "redis"), EmbeddedPostgres(data / "postgres")
        redis_server.start()
        postgres.start()
        try:
            async with daemon(redis_server.url, postgres.url, data) as port:
                client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
                env = Env(redis_server.url, postgres.url, port, client, args.quick)
                figures = await measure(env, args.only)
                if peers:
                    figures += await bench_peers(env, peers, figures)
                await client.aclose()
        finally:
            redis_server.stop()
            postgres.stop()
    show(figures)


async def delayed_fsyncs(env: Env) -> int:
    """Times Redis held back an AOF write because the background fsync of the last one was still running."""
    return int((await env.redis.info("persistence"))["aof_delayed_fsync"])


async def redis_stalls(env: Env, delayed: int) -> str:
    """What Redis's latency monitor saw since the last LATENCY RESET (events over STALL_MS), in words.

    A slow disk shows as `aof-write-pending-fsync` or `aof-fsync-always`: the main thread waited on the AOF,
    and every reply and publish waited with it. Each event's history holds one sample per second at most.
    """
    parts = []
    for event, _, _, worst in await env.redis.execute_command("LATENCY", "LATEST"):
        seconds = len(await env.redis.execute_command("LATENCY", "HISTORY", event))
        parts.append(f"{event} in {seconds} s (max {worst} ms)")
    stalls = ", ".join(parts) or "none"
    return f"Redis stalls over {STALL_MS} ms: {stalls}; AOF writes held back by a slow fsync: {delayed}"


STALL_MS = 5


def steal_ms() -> float:
    """Milliseconds the hypervisor has run something else on this VM's vCPUs, summed over vCPUs (0 off Linux).

    A tail latency that comes with steal was the host's, not the code's.
    """
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0
    return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


async def measure(env: Env, only: list[str] | None) -> list[Figure]:
    await env.redis.config_set("latency-monitor-threshold", STALL_MS)
    figures: list[Figure] = []
    for name, section in SECTIONS.items():
        if only and name not in only:
            continue
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        settle_gc()  # as the daemon does after start-up: in-process sections run with the same GC settings
        await quiet(env)
        before, delayed, stolen = await daemon_gc(env), await delayed_fsyncs(env), steal_ms()
        await env.redis.execute_command("LATENCY", "RESET")
        started = time.perf_counter()
        result = await section(env)
        took, stolen = time.perf_counter() - started, steal_ms() - stolen
        print(f"bench: {name}: {took:.1f} s; vCPU time the host took (steal): {stolen:.0f} ms; "
              f"the daemon's GC pauses: {gc_note(before, await daemon_gc(env))}; "
              f"{await redis_stalls(env, await delayed_fsyncs(env) - delayed)}", file=sys.stderr, flush=True)
        for figure in result if isinstance(result, list) else [result]:
            figure.extra["section_steal_ms"] = stolen  # the host's share of this figure's time
            judge(figure)
            figures.append(figure)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller counts: a run of under a minute")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    parser.add_argument("--peers", action="store_true", help="also the Agents SDK and ADK (own virtualenv)")
    args = parser.parse_args()
    if args.peers and args.only:  # the peer rows are ratios to these two
        args.only += [name for name in ("emit", "emit-64") if name not in args.only]
    anyio.run(run, args)


if __name__ == "__main__":
    main()
