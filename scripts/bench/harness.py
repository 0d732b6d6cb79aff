"""What every section uses: the run's Env, Figure and its Target, PAYLOAD and the timing helpers."""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import anyio
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection, connect

from memento_sessions import keys
from memento_sessions.auth import Identity, issue_token
from memento_sessions.backends import Backends, open_backends
from memento_sessions.redisio.pipe import Pipe
from memento_sessions.sessions.manager import SessionManager, emit_args, event_body, iso, now_ms
from memento_sessions.sessions.models import EventIn
from memento_sessions.settings import Settings, load_settings

SECRET = "bench-secret-0123456789-0123456789-abcdef"
PAYLOAD: dict[str, Any] = {
    "type": "modified",
    "changeInfo": {"elementType": "function", "entityIds": ["fn:parse_config", "fn:load"], "operation": "modified",
                   "affectedLines": 12},
    "impact": {"severity": "low", "perfDelta": -0.5},
}
Samples = list[float]


@dataclass(frozen=True)
class Target:
    """A figure's goal as data: a bound on the value itself, or on value / floor (the ratio)."""

    bound: float
    on_ratio: bool = False
    below: bool = False  # the value must stay under the bound (latencies); else reach it
    text: str = ""

    @classmethod
    def ratio_at_least(cls, times: float, floor_is: str = "", of: str = "floor") -> Target:
        """value / floor >= times: `>= 0.7 x floor (bare FCALL)`; of="peer" for the peers' rows."""
        return cls(times, on_ratio=True, text=f">= {times:g} x {of}" + (f" ({floor_is})" if floor_is else ""))

    @classmethod
    def below_ms(cls, ms: float) -> Target:
        """A p99 latency under `ms` milliseconds."""
        return cls(ms, below=True, text=f"p99 < {ms:g} ms")

    @classmethod
    def ratio_under(cls, times: float, floor_is: str = "") -> Target:
        """value / floor < times: `< 1.2 x floor (99 bare subscribers apart)`."""
        text = f"< {times:g} x floor" + (f" ({floor_is})" if floor_is else "")
        return cls(times, on_ratio=True, below=True, text=text)

    @classmethod
    def under(cls, value: float, unit: str) -> Target:
        """The value itself under `value`: `< 30 KB`."""
        return cls(value, below=True, text=f"< {value:g} {unit}")

    @classmethod
    def at_least(cls, value: float, unit: str) -> Target:
        """The value itself at least `value`: `>= 50,000 events/s`."""
        return cls(value, text=f">= {value:,.0f} {unit}")

    def met(self, figure: Figure) -> bool | None:
        """Whether the figure reaches the target (None: a ratio target without a floor)."""
        measured = figure.ratio if self.on_ratio else figure.value
        if measured is None:
            return None
        return measured < self.bound if self.below else measured >= self.bound


@dataclass
class Figure:
    """One measured figure beside its floor."""

    name: str
    unit: str
    value: float
    floor: float | None
    target: Target | None = None
    higher_is_better: bool = True
    met: bool | None = None
    extra: dict[str, float] = field(default_factory=dict)
    section: str = ""  # the registry's name of the section that measured it (what `--only` takes); set by the run

    @property
    def ratio(self) -> float | None:
        """value / floor, when there is a floor."""
        if not self.floor:
            return None
        return self.value / self.floor

    def judge(self) -> None:
        """Set `met` from the target."""
        self.met = self.target.met(self) if self.target else None

    def as_json(self) -> dict[str, Any]:
        """The figure as the JSON line prints it (the target as its text)."""
        return {"name": self.name, "unit": self.unit, "value": self.value, "floor": self.floor,
                "target": self.target.text if self.target else "", "higher_is_better": self.higher_is_better,
                "met": self.met, "extra": self.extra, "ratio": self.ratio, "section": self.section}


@dataclass
class Env:
    """What every measurement needs: the servers, the daemon's port and pid, a client of each redis-server.

    The servers are laid out as the daemon's embedded default: the sessions' Redis (`redis`) without
    FalkorDB, and a redis-server with FalkorDB of its own for the graphs (`falkordb`, the daemon's
    MEMENTO_FALKORDB_URL). A floor sends its GRAPH.* commands to `falkordb`, where the daemon sends its own.
    """

    redis_url: str
    falkordb_url: str
    postgres_dsn: str
    port: int
    redis: aioredis.Redis
    falkordb: aioredis.Redis
    quick: bool
    namespace: str = "bench"
    pipe: Pipe | None = None
    daemon_pid: int = 0
    # The floors' bare subscribers connect over loopback TCP, as the daemon's WebSocket clients do: the
    # daemon itself reaches Redis over its unix socket, but a subscriber on one pays less per message.
    redis_tcp_url: str = ""

    @property
    def subscriber_url(self) -> str:
        """Where a floor's bare subscribers connect: loopback TCP when the run has it."""
        return self.redis_tcp_url or self.redis_url

    def token(self, agent: str) -> str:
        """A token for `agent` in the bench namespace."""
        return issue_token(SECRET, agent, self.namespace, "sessions:read sessions:write kg:write", 3600)

    @property
    def servers(self) -> dict[str, aioredis.Redis]:
        """Both redis-servers, by the names the daemon's health and logs give them."""
        return {"redis": self.redis, "falkordb": self.falkordb}

    def settings(self, **overrides: object) -> Settings:
        """The settings of a daemon on the run's servers (the graphs on their own), with `overrides`."""
        return load_settings(redis_url=self.redis_url, falkordb_url=self.falkordb_url,
                             postgres_dsn=self.postgres_dsn, auth_secret=SECRET, **overrides)

    def backends(self, settings: Settings | None = None) -> AbstractAsyncContextManager[Backends]:
        """Backends opened as the daemon opens them, on the run's servers (the graphs on their own)."""
        return open_backends(settings or self.settings(), self.redis_url, self.postgres_dsn, self.falkordb_url)

    def manager(self) -> SessionManager:
        """A SessionManager wired as the daemon wires it (Function calls on the auto-pipelined connection)."""
        settings = self.settings()
        if self.pipe is None:
            self.pipe = Pipe(self.redis_url, settings.redis_spin_us)
        return SessionManager(self.redis, settings, self.pipe)

    def who(self, agent: str = "bench") -> Identity:
        """The identity in-process calls act as."""
        return Identity(agent, self.namespace, frozenset({"sessions:read", "sessions:write"}))


class Rpc:
    """A minimal JSON-RPC WebSocket peer (one request at a time)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        """The result of one request; raises RuntimeError on a JSON-RPC error."""
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
    """A WebSocket connection to the daemon as `agent`."""
    async with connect(f"ws://127.0.0.1:{env.port}/ws?token={env.token(agent)}", max_size=2**24,
                       max_queue=None, compression=None) as conn:
        yield Rpc(conn)


async def rate(count: int, work: Callable[[int], Awaitable[object]]) -> float:
    """Operations per second of `count` sequential calls of `work`."""
    start = time.perf_counter()
    for i in range(count):
        await work(i)
    return count / (time.perf_counter() - start)


async def paced(per_second: int, count: int, send: Callable[[], Awaitable[Any]]) -> None:
    """Call `send` `count` times at `per_second`, on a fixed schedule (no coordinated omission)."""
    start, interval = time.perf_counter(), 1.0 / per_second
    for i in range(count):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            await anyio.sleep(delay)
        await send()


async def concurrently(n: int, work: Callable[[int], Awaitable[object]]) -> float:
    """Rounds per second: n tasks each doing `work` once, timed together."""

    async def one(i: int) -> None:
        await work(i)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return n / (time.perf_counter() - start)


async def timed(count: int, work: Callable[[int], Awaitable[object]], *, remote: bool = False) -> Samples:
    """Milliseconds of each of `count` sequential calls of `work`.

    `remote`: the work is a request to another process (the daemon, Redis), so this process's cyclic
    collector is the measuring tool's, not the measured code's: it runs between two calls, when due, not
    inside one. Otherwise the daemon's samples carried the client's pauses and the floor's did not: in
    2,000 lease.acquire calls the WebSocket client set off 52 young collections here (0.1-0.4 ms), 4
    middle and 1 full one (1-44 ms), redis-py's 2,000 FCALLs none. Work that runs in this process (a
    section timing the manager in-process) keeps the collector inside its samples, as the daemon would.
    """
    samples = []
    with collector_between_calls() if remote else nullcontext():
        for i in range(count):
            start = time.perf_counter()
            await work(i)
            samples.append((time.perf_counter() - start) * 1000)
            if remote:
                collect_when_due()
    return samples


@contextmanager
def collector_between_calls() -> Iterator[None]:
    """The automatic collector off for the block (collect_when_due stands in for it), on again after."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def collect_when_due() -> None:
    """Collect the oldest generation whose count is past its threshold, as the automatic collector would."""
    counts, limits = gc.get_count(), gc.get_threshold()
    for generation in (2, 1, 0):
        if counts[generation] > limits[generation]:
            gc.collect(generation)
            return


def pct(samples: list[float], q: float) -> float:
    """The q-quantile of the samples (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: list[float]) -> float:
    """The median of the values."""
    return statistics.median(values)


def latency_extra(ours: Samples, floor: Samples) -> dict[str, float]:
    """The p50s printed beside a p99 figure."""
    return {"p50_ms": pct(ours, 0.5), "floor_p50_ms": pct(floor, 0.5)}


async def new_session(env: Env, manager: SessionManager) -> str:
    """A new session's id."""
    return str((await manager.create(env.who()))["sessionId"])


def floor_args(env: Env, sid: str, count: int = 1) -> tuple[list[str], list[str | int]]:
    """The exact FCALL ms_emit keys and args the manager sends for PAYLOAD."""
    event = EventIn.model_validate(PAYLOAD)
    stamp = iso(now_ms())
    args: list[str | int] = [now_ms(), "bench", keys.session_channel(env.namespace, sid), json.dumps(sid),
                             env.manager().settings.session_max_events]
    args += emit_args([event] * count, [event_body(event, "bench", json.dumps(sid), stamp)] * count)
    return keys.session_keys(env.namespace, sid).all(), args


async def stored_events(env: Env, sid: str) -> list[dict[str, Any]]:
    """Every stored event of a session, decoded, by one bare ZRANGEBYSCORE."""
    members: list[Any] = await env.redis.zrangebyscore(keys.session_keys(env.namespace, sid).events, "-inf", "+inf")
    return [json.loads(member) for member in members]
