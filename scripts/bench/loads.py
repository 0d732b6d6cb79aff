"""What one tenant does to the others in the noisy-neighbour section: three loads, each one connection
making one request at a time, as fast as the daemon answers.

- leases: 64 files that each DEFINE 63 symbols (kg.upsert), and shared leases over all 64 files (so
  4,096 entities each), 50 of them taken before the window; in it, the oldest is released and a new
  one acquired, turn about, so every call works on entities that 49 or 50 leases hold.
- checkpoints: event.emitBatch of 300 events with 256 new entity ids each, the last a `checkpoint`
  event, then session.checkpoint (which waits for that checkpoint): every step anchors 76,800 new ids.
- forks: session.fork of a session of 50 MB of events (a snapshot every 1,000), again and again; each
  fork is removed once made, so Redis holds one at a time.

With --quick: 16 leases, a 10 MB session. Each step is bounded by the victim's window (neighbour.py), and
by a count of steps as a safety net.

A load is tolerant of a daemon that bounds it: a refused call is counted (`errors`) and the load goes on
(a refused lease makes it release one first); replies are read for the fields named here only. A step
that succeeded counts towards the load's `steps`; a refused one does not.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from redis.exceptions import RedisError
from websockets.exceptions import ConnectionClosed

from bench.harness import Env, Rpc, Samples
from bench.tenant import Tenant, heavy_session, session_mb, unlink_session
from memento_sessions import keys

FILES, SYMBOLS = 64, 63
EVENTS, IDS = 300, 256


class Load(Protocol):
    """A tenant's load: made ready before the window, run one step (a request or two) at a time."""

    name: str
    tenant: Tenant
    steps: int  # at most this many steps in a window

    async def setup(self, env: Env, rpc: Rpc) -> None: ...

    async def step(self, rpc: Rpc) -> None: ...

    async def cleanup(self, env: Env) -> None: ...

    def note(self) -> dict[str, float]: ...


@dataclass
class LoadRun:
    """What a load did in its window: each step's milliseconds, the refused ones, whether it ran out."""

    ops: Samples = field(default_factory=list)
    errors: int = 0
    finished: anyio.Event = field(default_factory=anyio.Event)


async def drive(load: Load, rpc: Rpc, stop: anyio.Event, run: LoadRun) -> None:
    """Step the load until `stop` is set or `load.steps` steps succeeded (then `run.finished` is set too).

    A refused step does not count: a load the daemon refuses keeps trying (every 10 ms) until the window
    ends, as a careless tenant would."""
    done = 0
    try:
        while done < load.steps and not stop.is_set():
            started = time.perf_counter()
            try:
                await load.step(rpc)
                done += 1
            except (RuntimeError, RedisError):  # the daemon refused the step, or the bench's clean-up timed out
                run.errors += 1
                await anyio.sleep(0.01)
            run.ops.append((time.perf_counter() - started) * 1000)
    except ConnectionClosed:
        run.errors += 1  # the daemon closed the tenant's connection: the load is over
    finally:
        run.finished.set()


@dataclass
class Leases:
    """Shared leases over 64 files and the 4,032 symbols they define."""

    tenant: Tenant
    held_target: int
    steps: int
    setup_seconds: float
    name: str = "leases"
    held: list[str] = field(default_factory=list)
    refused: int = 0
    setup_ms: float = 0.0

    def files(self) -> list[str]:
        return [f"f{n}" for n in range(FILES)]

    async def setup(self, env: Env, rpc: Rpc) -> None:
        """The graph, then shared leases up to `held_target` (or until refused, or setup_seconds)."""
        nodes = [{"id": file, "labels": ["CodebaseEntity"]} for file in self.files()]
        nodes += [{"id": f"{file}.s{n}", "labels": ["Symbol"]} for file in self.files() for n in range(SYMBOLS)]
        edges = [{"from": file, "to": f"{file}.s{n}", "type": "DEFINES"} for file in self.files()
                 for n in range(SYMBOLS)]
        await rpc.call("kg.upsert", {"nodes": nodes, "edges": edges})
        started = time.perf_counter()
        with anyio.move_on_after(self.setup_seconds):
            while len(self.held) < self.held_target and await self.acquire(rpc):
                pass
        self.setup_ms = (time.perf_counter() - started) * 1000
        self.held_target = max(1, len(self.held))

    async def acquire(self, rpc: Rpc) -> bool:
        """One shared lease on every file; False when it was refused (the load then holds what it has)."""
        try:
            reply: dict[str, Any] = await rpc.call("lease.acquire", {"entityIds": self.files(), "ttl": 600,
                                                                     "mode": "shared"})
        except RuntimeError:  # e.g. a bound on leases or on holds per entity
            reply = {}
        if reply.get("granted") and reply.get("leaseId"):
            self.held.append(str(reply["leaseId"]))
            return True
        self.refused += 1
        return False

    async def step(self, rpc: Rpc) -> None:
        if len(self.held) >= self.held_target:
            await rpc.call("lease.release", {"leaseId": self.held.pop(0)})
        elif not await self.acquire(rpc):
            self.held_target = max(1, len(self.held))  # refused: release one before the next try

    async def cleanup(self, env: Env) -> None:
        """The leases go with the namespace's lease keys: releasing each would take as long as the load."""
        await env.redis.unlink(*keys.lease_keys(self.tenant.namespace).all())

    def note(self) -> dict[str, float]:
        return {"leases_held": len(self.held), "leases_refused": self.refused, "setup_s": self.setup_ms / 1000}


@dataclass
class Checkpoints:
    """Batches of 300 events x 256 new entity ids, each checkpointed.

    The batch is encoded once, before the window, its ids marked with a `~` that each step replaces by a
    prefix of its own (base 36): encoding 800 KB in this process at every step would stall the victim's
    client beside it; one str.replace does not."""

    tenant: Tenant
    steps: int
    name: str = "checkpoints"
    sid: str = ""
    template: str = ""
    sent: int = 0

    async def setup(self, env: Env, rpc: Rpc) -> None:
        self.sid = str((await rpc.call("session.create", {}))["sessionId"])
        events = [{"type": "checkpoint" if n == EVENTS - 1 else "modified",
                   "changeInfo": {"entityIds": [f"~{n * IDS + i:x}" for i in range(IDS)]}} for n in range(EVENTS)]
        self.template = json.dumps({"sessionId": self.sid, "events": events}, separators=(",", ":"))

    async def step(self, rpc: Rpc) -> None:
        prefix = base36(self.sent).rjust(2, "0")
        await call_encoded(rpc, "event.emitBatch", self.template.replace('"~', '"' + prefix))
        self.sent += 1  # stored: the next step names new ids
        await rpc.call("session.checkpoint", {"sessionId": self.sid})

    async def cleanup(self, env: Env) -> None:
        pass  # the graph keeps the anchors (the load's product); the session expires

    def note(self) -> dict[str, float]:
        return {"batches_sent": self.sent}


def base36(n: int) -> str:
    """`n` in base 36 (0-9a-z)."""
    digits = ""
    while True:
        n, digit = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + digits
        if not n:
            return digits


async def call_encoded(rpc: Rpc, method: str, params: str) -> Any:
    """Rpc.call with the params already encoded as JSON."""
    rpc.next_id += 1
    await rpc.ws.send(f'{{"jsonrpc":"2.0","id":{rpc.next_id},"method":"{method}","params":{params}}}')
    while True:
        reply = json.loads(await rpc.ws.recv())
        if reply.get("id") == rpc.next_id:
            if "error" in reply:
                raise RuntimeError(reply["error"])
            return reply["result"]


@dataclass
class Forks:
    """Forks of one heavy session, each removed once made."""

    tenant: Tenant
    megabytes: float
    steps: int
    name: str = "forks"
    env: Env | None = None
    sid: str = ""
    seq: int = 0
    size_mb: float = 0.0

    async def setup(self, env: Env, rpc: Rpc) -> None:
        self.env = env
        self.sid, self.seq = await heavy_session(env, self.tenant, self.megabytes)
        self.size_mb = await session_mb(env, self.tenant, self.sid)

    async def step(self, rpc: Rpc) -> None:
        reply: dict[str, Any] = await rpc.call("session.fork", {"sessionId": self.sid, "atSeq": self.seq})
        if self.env is not None and reply.get("sessionId"):
            await unlink_session(self.env, self.tenant, str(reply["sessionId"]))

    async def cleanup(self, env: Env) -> None:
        await unlink_session(env, self.tenant, self.sid)

    def note(self) -> dict[str, float]:
        return {"session_mb": self.size_mb, "session_events": self.seq}
