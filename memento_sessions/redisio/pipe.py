"""An auto-pipelining Redis connection for the Function calls on the hot path.

redis-py spends about 100 us of Python per command and, under concurrency, one connection and one
write per command. Here every call made in the same event-loop turn goes out in one write on one
connection, and replies are matched to callers in order (Redis answers in order on a connection):
the approach of ioredis' autopipelining and Lettuce. Nothing is retried: an FCALL whose reply is
lost may have run, so the caller gets a ConnectionError (-32050) and decides (an event `id` makes
a retry safe). A connection that cannot be opened is not tried again before the backoff policy's pause
(retry.RECONNECT by default): meanwhile calls fail at once with the connect error, instead of each
waiting its own connect timeout in turn while Redis is away.

A call made with `Acks` (MEMENTO_REPLICA_ACKS) is answered once that many replicas hold its write: such
calls go out on a second connection, where a `WAIT n timeout` follows the commands of each loop turn, and
that one WAIT covers every write sent before it on the connection (the calls without Acks keep the first
connection, so they never queue behind a WAIT); past its timeout the call is -32050 (replicas_behind).

A command of LARGE_CALL bytes or more (a batch of events) goes out on a connection of its own too. Redis
reads a connection's pipeline 16 KB per turn of its event loop and answers it in order, so behind a 700 KB
batch on the shared connection every small call would wait for Redis to read the whole batch, then to run
it; on its own connection the small calls are read and run between those turns (Redis still runs the batch's
Function in one piece: other clients wait for that alone).

After a write on an idle connection the loop is kept polling, not sleeping, until the reply is in
or `spin` seconds have passed: on a VM, waking a vCPU that went idle costs tens of microseconds,
twice per round trip, more than Redis's own work on an emit. See docs/hot-path.md.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, cast

import anyio
import hiredis
from redis.exceptions import BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memento_sessions.errors import BackendUnavailable, Reason
from memento_sessions.logs import get_logger
from memento_sessions.metrics import REDIS_SPIN_MISSES, REDIS_SPINS
from memento_sessions.redisio.resp import Address, connect, pack
from memento_sessions.retry import RECONNECT, Backoff, Failures

log = get_logger(__name__)
CALL_TIMEOUT = 5.0
POLL_SLICE = 20e-6  # the longest one loop turn reads the socket itself while spinning; then others run
LARGE_CALL = 64 * 1024  # bytes of a command sent on the connection of large calls (no spinning there)


@dataclass(frozen=True, slots=True)
class Acks:
    """How many replicas must hold a call's write before it is answered, and for how long to wait."""

    replicas: int
    timeout_ms: int


def replicas_behind(acks: Acks, acked: int) -> BackendUnavailable:
    """The error of a write fewer replicas than asked acknowledged within the timeout: it may be lost in a
    failover, so the call is unavailable (-32050, data.reason replica_ack_timeout) and retried (an event `id`
    makes the retry safe)."""
    return BackendUnavailable(f"redis: {acked} of {acks.replicas} replicas acknowledged within {acks.timeout_ms} ms",
                              {"backend": "redis", "reason": Reason.REPLICA_ACK_TIMEOUT})


async def call_acked(redis: Any, pipe: Pipe | None, acks: Acks, *command: str | int | float) -> Any:
    """One command and a WAIT after it on one connection (the pipe's, else one redis-py pipeline's): answered
    once `acks.replicas` replicas hold its write, -32050 (replica_ack_timeout) past the timeout."""
    if pipe is not None:
        return await pipe.call_acked(acks, *command)
    async with redis.pipeline(transaction=False) as batch:
        batch.execute_command(*command)
        batch.wait(acks.replicas, acks.timeout_ms)
        reply, acked = await batch.execute(raise_on_error=False)
    if isinstance(reply, Exception):
        raise reply
    if int(acked) < acks.replicas:
        raise replicas_behind(acks, int(acked))
    return reply


class _Protocol(asyncio.Protocol):
    """One connection: an outbox flushed once per loop turn, and the callers waiting in reply order."""

    def __init__(self, spin: float = 0.0) -> None:
        self.reader = hiredis.Reader(encoding="utf-8", replyError=ResponseError)  # text, as the Functions reply
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.outbox: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None
        self.progress_at = 0.0
        self.spin = spin
        self.spin_until = 0.0
        self.fd = -1  # the plain socket, read directly while spinning (-1: TLS, closed, or no spin)
        self.acks: dict[Acks, asyncio.Future[Any]] = {}  # the WAIT each Acks will send at the end of this turn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        sock = transport.get_extra_info("socket")
        if self.spin and sock is not None and transport.get_extra_info("sslcontext") is None:
            self.fd = sock.fileno()
        asyncio.get_running_loop().call_later(1.0, self.check)

    def send(self, command: bytes, future: asyncio.Future[Any] | None = None) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future = future or loop.create_future()
        if not self.waiting and self.transport is not None and self.lost is None:
            self.transport.write(command)  # idle: no one to batch with, so no extra loop turn
            if self.spin:
                REDIS_SPINS.inc()
                self.spin_until = time.perf_counter() + self.spin
                loop.call_soon(self.poll)
        else:
            if not self.outbox:
                loop.call_soon(self.flush)
            self.outbox.append(command)
        if not self.waiting:
            self.progress_at = loop.time()
        self.waiting.append(future)
        return future

    def acked(self, acks: Acks) -> asyncio.Future[Any]:
        """The reply of a WAIT sent after every command sent so far in this loop turn: one WAIT (queued once
        per turn) covers the writes of every call of the turn, as Redis's WAIT covers every write sent
        before it on its connection."""
        future = self.acks.get(acks)
        if future is None:
            loop = asyncio.get_running_loop()
            future = self.acks[acks] = loop.create_future()
            future.add_done_callback(_retrieved)  # callers whose own call failed do not await it
            loop.call_soon(self._send_wait, acks)
        return future

    def _send_wait(self, acks: Acks) -> None:
        future = self.acks.pop(acks)
        if self.lost is not None:
            future.set_exception(self.lost)
        else:
            self.send(pack(("WAIT", acks.replicas, acks.timeout_ms)), future)

    def poll(self) -> None:
        """While replies are due and the spin lasts, keep the loop turning instead of sleeping.

        Each turn reads the socket for at most POLL_SLICE (a plain socket; a TLS one is read by its
        transport), then queues itself again, so other tasks still run between turns, and their
        calls still go out together.
        """
        if not self.waiting or self.lost is not None:
            return
        now = time.perf_counter()
        if self.fd >= 0 and self.transport is not None and not self.transport.is_closing():
            self.read_now(min(self.spin_until, now + POLL_SLICE))
            if not self.waiting:
                return
        if now < self.spin_until:
            asyncio.get_running_loop().call_soon(self.poll)
        else:
            REDIS_SPIN_MISSES.inc()

    def read_now(self, until: float) -> None:
        """Read what the socket has, spinning until `until` for the first bytes; EOF and errors are
        left for the transport to see."""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                if time.perf_counter() >= until:
                    return
                continue
            except OSError:
                return
            if data:
                try:
                    self.data_received(data)
                except Exception as exc:  # as the transport does with its own reads: the connection is done
                    self.give_up(RedisConnectionError(f"bad reply from Redis: {exc!r}"))
            return

    def check(self) -> None:
        """Once a second: if replies are awaited and none came for CALL_TIMEOUT, give the connection up."""
        if self.lost is not None:
            return
        loop = asyncio.get_running_loop()
        if self.waiting and loop.time() - self.progress_at > CALL_TIMEOUT:
            self.give_up(RedisTimeoutError(f"no reply from Redis within {CALL_TIMEOUT}s"))
            return
        loop.call_later(1.0, self.check)

    def give_up(self, error: Exception) -> None:
        """Fail every waiting call with `error` and close: later replies would be out of step, so the
        next call opens a new connection."""
        self.lost = error
        self.fail_all()
        self.close()

    def flush(self) -> None:
        if self.transport is not None and self.outbox and self.lost is None:
            self.transport.write(b"".join(self.outbox))
        self.outbox = []

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            future = self.waiting.popleft()
            self.progress_at = asyncio.get_running_loop().time()
            if not future.done():  # a caller that gave up (timeout, cancel) is skipped in order
                if isinstance(reply, ResponseError):
                    future.set_exception(not_answering(reply))
                else:
                    future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fd = -1  # the descriptor may be closed and its number reused from here on
        if self.lost is None:
            self.lost = RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}")
        self.fail_all()

    def fail_all(self) -> None:
        assert self.lost is not None
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(self.lost)

    def close(self) -> None:
        self.fd = -1
        if self.transport is not None:
            self.transport.close()


class Pipe:
    """Auto-pipelined calls over one lazily (re)connected connection to a `redis://` URL."""

    def __init__(self, url: str, spin_us: int = 0, backoff: Backoff = RECONNECT) -> None:
        """`spin_us`: microseconds the loop keeps polling for a reply after a write on an idle
        connection (MEMENTO_REDIS_SPIN_US); 0 sleeps at once. `backoff`: pauses between failed connects."""
        self.address = Address.parse(url)
        self.spin = spin_us / 1e6
        self._protocol: _Protocol | None = None
        self._lock = anyio.Lock()
        self._failures = Failures(backoff)
        self._url, self._backoff = url, backoff
        self._waits: Pipe | None = None  # the connection of the calls made with Acks (their WAITs hold it)
        self._large: Pipe | None = None  # the connection of the calls of LARGE_CALL bytes or more

    @staticmethod
    def supports(url: str) -> bool:
        """The URLs resp.connect opens: redis://, rediss:// and unix://."""
        return url.startswith(("redis://", "rediss://", "unix://"))

    async def call(self, *args: str | int | float) -> Any:
        """Send one command (in the same write as the others of this loop turn) and await its reply
        (bulk strings as str)."""
        command = pack(args)
        if len(command) >= LARGE_CALL:
            if self._large is None:  # no spinning: Redis takes milliseconds to read and run such a call
                self._large = Pipe(self._url, 0, self._backoff)
            protocol = await self._large._connected()
        else:
            protocol = await self._connected()
        return await protocol.send(command)  # the connection's watchdog enforces CALL_TIMEOUT

    async def call_asking(self, *args: str | int | float, acks: Acks | None = None) -> Any:
        """ASKING and the command back to back on one connection: a Redis Cluster slot being migrated
        serves the command on the importing node only right after ASKING."""
        if acks is not None:
            return await self._acked(acks, args, asking=True)
        protocol = await self._connected()
        asking, reply = protocol.send(pack(("ASKING",))), protocol.send(pack(args))
        await asking
        return await reply

    async def call_acked(self, acks: Acks, *args: str | int | float) -> Any:
        """`call`, answered once `acks.replicas` replicas hold its write (replicas_behind past the timeout)."""
        return await self._acked(acks, args, asking=False)

    async def _acked(self, acks: Acks, args: tuple[str | int | float, ...], *, asking: bool) -> Any:
        """On a connection of their own: a WAIT holds its connection until the replicas answer (up to the
        timeout, when one is away), and the calls made without Acks must not queue behind it."""
        if self._waits is None:
            self._waits = Pipe(self._url, int(self.spin * 1e6), self._backoff)
        protocol = await self._waits._connected()
        asked = protocol.send(pack(("ASKING",))) if asking else None
        reply, acked = protocol.send(pack(args)), protocol.acked(acks)
        if asked is not None:
            await asked
        result = await reply
        if (count := int(await acked)) < acks.replicas:
            raise replicas_behind(acks, count)
        return result

    async def _connected(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.lost is None:
            return protocol
        async with self._lock:
            if self._protocol is None or self._protocol.lost is not None:
                self._protocol = await self._reconnect()
            return self._protocol

    async def _reconnect(self) -> _Protocol:
        """A new connection, unless the last connect failed less than the policy's pause ago."""
        if (refused := self._failures.refusal()) is not None:
            raise RedisConnectionError(refused)
        try:
            protocol = await self._connect()
        except RedisConnectionError as exc:
            self._failures.refuse(exc)
            raise
        self._failures.succeeded()
        return protocol

    async def _connect(self) -> _Protocol:
        protocol = await connect(self.address, lambda: _Protocol(self.spin))
        if self.address.auth:
            await protocol.send(pack(("AUTH", *self.address.auth)))
        if self.address.db:
            await protocol.send(pack(("SELECT", self.address.db)))
        return protocol

    def close(self) -> None:
        """Close the connections; safe to call twice."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.close()
        for other in (self._waits, self._large):
            if other is not None:
                other.close()


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a shared future's exception as seen (asyncio logs those nobody retrieved)."""
    if not future.cancelled():
        future.exception()


# Replies of a Redis that is up but cannot serve now: loading its data, busy in a script, a replica without
# its primary, a cluster without a slot's owner or mid-rehash. They mean "unavailable, try again", not a bad
# command: as BusyLoadingError (a ConnectionError) every caller's unavailability handling covers them.
NOT_ANSWERING = ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")


def not_answering(reply: ResponseError) -> ResponseError | BusyLoadingError:
    """The error a reply raises: a BusyLoadingError for the replies of a Redis that cannot serve now."""
    return BusyLoadingError(str(reply)) if str(reply).startswith(NOT_ANSWERING) else reply
