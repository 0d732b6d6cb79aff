"""The noisy-neighbour victim in a process of its own, so that the load's client work is not the victim's.

A tenant's load is another agent's: it encodes and sends its requests on its own machine or process. Run
beside the victim on one event loop, a 700 KB batch's sending held the victim's loop for 5-7 ms at every
step, a stall no daemon could have caused or avoided. So the victim runs here, and the load in the bench.

`apart(...)` runs this module as `python -m bench.victim '<spec>'`. The child opens its lean client, makes
its session, warms up, and prints `{"ready": "<sessionId>"}`. Then, for each `window` line on stdin, it
emits one event at a time on the schedule (`pace` a second) until it has sent `count`, or an `end` line
arrives (the load is over), or the deadline passes (three times the window's planned length); a bare PING
goes to the sessions' Redis every `ping_every` seconds beside it. It prints the window (its samples) as one
JSON line. An `end` outside a window is ignored; stdin closed ends the child. A spec is a JSON object:
`port`, `token`, `redis_url`, `count`, `pace`, `ping_every`, `call_timeout`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aioredis
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from redis.exceptions import TimeoutError as RedisTimeout

from bench.harness import Samples, collect_when_due, collector_between_calls, pct, timed
from bench.receivers import LeanCaller, masked_frame, upgraded

VICTIM_EVENT = {"type": "modified", "changeInfo": {"entityIds": ["fn:parse_config"]}}
LINE_MAX = 1 << 24  # a window's samples: ~25 bytes each, a few thousand of them
SCRIPTS = Path(__file__).resolve().parent.parent  # the bench package's parent, then the project: the child's path


@dataclass
class Window:
    """The victim's emits in one window, the bare PINGs beside them, and how long it ran."""

    emits: Samples = field(default_factory=list)
    late: Samples = field(default_factory=list)  # from when each emit was due to its reply
    errors: int = 0
    pings: Samples = field(default_factory=list)
    ping_timeouts: int = 0
    seconds: float = 0.0
    aof_rewrites: int = 0  # AOF rewrites of the sessions' Redis that ended within the window (the parent's count)

    def extra(self) -> dict[str, float]:
        return {"p50_ms": q(self.late, 0.5), "max_ms": q(self.late, 1.0), "per_call_p99_ms": q(self.emits, 0.99),
                "per_call_p50_ms": q(self.emits, 0.5), "emits": len(self.emits), "emit_errors": self.errors,
                "window_s": self.seconds, "redis_ping_p99_ms": q(self.pings, 0.99),
                "redis_ping_max_ms": q(self.pings, 1.0), "redis_ping_timeouts": self.ping_timeouts,
                "redis_aof_rewrites": self.aof_rewrites}


def q(samples: Samples, quantile: float) -> float:
    """pct, or NaN for a window that ended before its first sample (a load that stopped at once)."""
    return pct(samples, quantile) if samples else math.nan


@dataclass
class Victim:
    """The parent's handle on the victim's process."""

    proc: Process
    lines: BufferedByteReceiveStream
    deadline: float  # seconds a window may take at most, its reply included

    async def window(self, ended: anyio.Event | None) -> Window:
        """One window of the victim's emits; `ended` set (the load is over) ends it early."""
        assert self.proc.stdin is not None
        stdin = self.proc.stdin
        await stdin.send(b"window\n")

        async def tell() -> None:
            assert ended is not None
            await ended.wait()
            await stdin.send(b"end\n")

        async with anyio.create_task_group() as tg:
            if ended is not None:
                tg.start_soon(tell)
            with anyio.fail_after(self.deadline):
                line = await self.lines.receive_until(b"\n", LINE_MAX)
            tg.cancel_scope.cancel()
        return Window(**json.loads(line))


@asynccontextmanager
async def apart(port: int, token: str, redis_url: str, count: int, pace: float, ping_every: float,
                call_timeout: float) -> AsyncIterator[Victim]:
    """The victim's process, ready (its session made, warmed up); ended on exit."""
    spec = {"port": port, "token": token, "redis_url": redis_url, "count": count, "pace": pace,
            "ping_every": ping_every, "call_timeout": call_timeout}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS), str(SCRIPTS.parent)])}
    proc = await anyio.open_process([sys.executable, "-m", "bench.victim", json.dumps(spec)], env=env, stderr=None)
    try:
        assert proc.stdout is not None
        lines = BufferedByteReceiveStream(proc.stdout)
        with anyio.fail_after(60):
            json.loads(await lines.receive_until(b"\n", LINE_MAX))  # {"ready": ...}
        yield Victim(proc, lines, 3 * count / pace + 2 * call_timeout)
    finally:
        with anyio.move_on_after(30, shield=True):
            if proc.returncode is None and proc.stdin is not None:
                await proc.stdin.aclose()  # the child's readline returns empty: it exits
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
        await proc.aclose()


async def emit_frame(caller: LeanCaller) -> bytes:
    """The victim's session, and the masked frame of its event.emit."""
    create = masked_frame(0x1, b'{"jsonrpc":"2.0","id":1,"method":"session.create","params":{}}')
    sid = json.loads(await caller.call(create))["result"]["sessionId"]
    return masked_frame(0x1, json.dumps({"jsonrpc": "2.0", "id": 2, "method": "event.emit",
                                         "params": {"sessionId": sid, "event": VICTIM_EVENT}}).encode())


async def run_window(spec: dict[str, Any], caller: LeanCaller, frame: bytes, redis: aioredis.Redis,
                     ended: asyncio.Event) -> Window:
    """Up to `count` emits, one at a time at `pace` a second, until `ended` is set or the deadline passes."""
    seen, done = Window(), asyncio.Event()
    count, pace = spec["count"], spec["pace"]

    async def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            try:
                await redis.ping()
            except RedisTimeout:  # Redis held its thread past the client's socket timeout (5 s): a sample too
                seen.ping_timeouts += 1
            seen.pings.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(spec["ping_every"])

    deadline, start = 3 * count / pace, time.perf_counter()
    pinging = asyncio.create_task(probe())
    with collector_between_calls():
        for i in range(count):
            if ended.is_set() or time.perf_counter() - start > deadline:
                break
            due = start + i / pace
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            sent = time.perf_counter()
            reply = await asyncio.wait_for(caller.call(frame), spec["call_timeout"])
            replied = time.perf_counter()
            seen.emits.append((replied - sent) * 1000)
            seen.late.append((replied - due) * 1000)
            seen.errors += b'"result"' not in reply
            collect_when_due()
    done.set()
    await pinging
    seen.seconds = time.perf_counter() - start
    return seen


async def child(spec: dict[str, Any]) -> None:
    """The child process: ready, then a window per `window` line until stdin closes."""
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str] = asyncio.Queue()  # stdin's lines; "" once it closed

    def read_stdin() -> None:
        while line := sys.stdin.readline():
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "")

    caller = await upgraded(spec["port"], spec["token"], LeanCaller)
    redis = aioredis.Redis.from_url(spec["redis_url"], socket_timeout=5.0)
    frame = await emit_frame(caller)
    await timed(100, lambda _: caller.call(frame), remote=True)  # warm
    print(json.dumps({"ready": True}), flush=True)
    reader = loop.run_in_executor(None, read_stdin)
    closed = False
    while not closed and (command := await commands.get()) != "":
        if command != "window":
            continue  # an `end` that came after its window
        ended = asyncio.Event()

        async def watch(ended: asyncio.Event = ended) -> None:
            nonlocal closed
            while (line := await commands.get()) not in ("end", ""):
                pass
            closed = line == ""
            ended.set()

        watcher = asyncio.create_task(watch())
        seen = await run_window(spec, caller, frame, redis, ended)
        watcher.cancel()
        print(json.dumps(asdict(seen)), flush=True)
    await redis.aclose()
    if caller.transport is not None:
        caller.transport.close()
    await reader


if __name__ == "__main__":
    asyncio.run(child(json.loads(sys.argv[1])))
