"""Limits on how fast one client or one namespace may go: token buckets and per-namespace paces.

Token buckets: a client over its rate gets -32029, and nothing it asked for runs.

A WebSocket connection has its own bucket (gateway.py); MCP tool calls, which arrive as separate HTTP
requests, share one bucket per agent (`Buckets`).

Paces, fair shares of the daemon's and Redis's time: a namespace's heavy work is paced, the others' is not.

Small requests go first: large work (a large request's parse, validation and bodies, a checkpoint's or a
copy's steps) waits between two of its parts for the small requests in flight (`Foreground`), a few ms at most.

Letting go is work too: the 76,800 entity ids of a large batch, freed at once when the last reference goes,
hold the event loop about 2 ms. `let_go` empties such a list or set a part at a time instead.

Some requests do work in proportion to what they name: a lease write on every entity its lease covers (about
5 us each on a 2-vCPU host, in calls of at most MEMENTO_LEASE_CALL_ENTITIES); an event batch and its
checkpoint on every entity id (validated, stored, summarised: about 4 us each in the daemon). One tenant
sending such requests back to back keeps Redis or the daemon busy, and every other tenant waits behind
it. So each namespace has a budget of such units a second per daemon (MEMENTO_LEASE_PACE covered
entities, MEMENTO_BATCH_IDS_PACE entity ids): a step of work whose namespace owes more than a tenth of a
second of it waits, before it runs, until its earlier steps are paid for. A namespace that works a little
at a time never waits; one that sends thousands back to back gets them at the budget's rate, and the
other tenants find Redis and the daemon free between its steps.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from memento_sessions.errors import RateLimited

if TYPE_CHECKING:
    from prometheus_client import Counter  # a server package: the client's light install has none

KEPT = 10_000  # namespaces whose spending is remembered at once; past it, those fully paid are forgotten
FREE_PART = 4096  # items let go of between two turns of the event loop (about 0.1 ms of entity ids)
AHEAD = 0.1  # seconds of its budget a namespace may owe without waiting


class Foreground:
    """Small requests in flight in this process, ahead of large work.

    Large work (a large request's parse, validation and bodies, letting go of it, a checkpoint's parts)
    takes a `turn` between two of its parts: the event loop's next round, and then, while a small request
    that started less than FRESH seconds ago is still in flight, a wait for it of up to `most` seconds.
    Without the wait, each of a small request's own rounds of the event loop came after a part of the
    large work: a 1 ms emit took 5 to 9 ms while another tenant's 700 KB batch was being handled. A small
    request in flight for longer (one that waits for a checkpoint, or on a slow backend) no longer holds
    the large work back; and with small requests arriving without pause, large work still gets a part
    done every `most` seconds. A small request's own turns (a batch of many small events) never wait.
    """

    FRESH = 0.05
    _small: contextvars.ContextVar[bool] = contextvars.ContextVar("small_request", default=False)

    def __init__(self, most: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.most, self.clock = most, clock
        self._started: OrderedDict[object, float] = OrderedDict()  # requests in flight, oldest first
        self._waiting: list[asyncio.Future[None]] = []

    @contextmanager
    def serving(self, small: bool = True) -> Iterator[None]:
        """Counts a small request as in flight for as long as the block runs (a large one, `small` false, not)."""
        if not small:
            yield
            return
        token, was = object(), self._small.set(True)
        self._started[token] = self.clock()
        try:
            yield
        finally:
            self._small.reset(was)
            del self._started[token]
            waiting, self._waiting = self._waiting, []
            for future in waiting:
                if not future.done() and not future.get_loop().is_closed():  # a loop gone: a test's, say
                    future.set_result(None)

    def _fresh(self) -> bool:
        """Whether a small request that started less than FRESH seconds ago is in flight."""
        return bool(self._started) and self.clock() - next(reversed(self._started.values())) < self.FRESH

    async def turn(self) -> None:
        """A turn for others: the event loop's next round, then past the small requests in flight (bounded)."""
        await anyio.lowlevel.checkpoint()
        if self._small.get():
            return
        until = self.clock() + self.most
        while self._fresh() and (left := until - self.clock()) > 0:
            future = asyncio.get_running_loop().create_future()
            self._waiting.append(future)
            try:
                await asyncio.wait([future], timeout=left)
            finally:
                if not future.done():
                    future.cancel()
                    self._waiting.remove(future)


FOREGROUND = Foreground(0.005)  # this process's: every connection's small requests, every large work's turns


class Pacer:
    """Per-namespace spending, repaid at `rate` units a second (0: no pacing); waits are counted in `waited`."""

    def __init__(self, rate: int, waited: Counter | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.waited, self.clock = rate, waited, clock
        self._owed: dict[str, tuple[float, float]] = {}  # namespace -> (entities not yet repaid, as of when)

    def owed(self, namespace: str) -> float:
        """Units the namespace's earlier steps have not yet repaid."""
        owed, at = self._owed.get(namespace, (0.0, 0.0))
        return max(0.0, owed - (self.clock() - at) * self.rate)

    def charge(self, namespace: str, units: int) -> float:
        """Add a step's cost; the seconds it must wait first (until what was owed before it, less AHEAD
        seconds' worth, is repaid)."""
        if self.rate <= 0:
            return 0.0
        before = self.owed(namespace)
        if len(self._owed) >= KEPT:
            self._forget_paid()
        self._owed[namespace] = (before + units, self.clock())
        return max(0.0, before / self.rate - AHEAD)

    async def take(self, namespace: str, units: int = 0) -> None:
        """Charge a step of `units` (0 when they are known only after it: `charge` them then) and wait its turn."""
        wait = self.charge(namespace, units)
        if wait <= 0:
            await FOREGROUND.turn()  # a turn for others all the same
            return
        if self.waited is not None:
            self.waited.inc(wait)
        await anyio.sleep(wait)

    def _forget_paid(self) -> None:
        for namespace in [ns for ns in self._owed if self.owed(ns) == 0.0]:
            del self._owed[namespace]


class TokenBucket:
    """`rate` requests a second on average, bursts of up to `burst`."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def take(self) -> None:
        """Spend one token, or raise RateLimited saying when the next one comes."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            wait_ms = int((1.0 - self.tokens) / self.rate * 1000) + 1
            raise RateLimited("rate limited", {"retryAfterMs": wait_ms, "limit": self.rate})
        self.tokens -= 1.0


class Buckets:
    """One TokenBucket per key (an agent), for at most `keep` keys: the least recently used goes first.

    An agent pushed out starts again with a full bucket, so the bound can let one extra burst through;
    it keeps a daemon's memory flat whatever the number of agents.
    """

    def __init__(self, rate: float, keep: int = 10_000) -> None:
        self.rate, self.keep = rate, keep
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()

    def take(self, key: Hashable) -> None:
        """Spend one of `key`'s tokens, or raise RateLimited."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.rate)
            if len(self._buckets) > self.keep:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        bucket.take()


async def let_go(items: list[Any] | set[Any], part: int = FREE_PART) -> None:
    """Empty `items` `part` at a time, with a turn for others between: what only `items` held is freed as it
    goes, not all at once when the last reference to it goes."""
    while items:
        if isinstance(items, list):
            del items[-part:]
        else:
            for _ in range(min(part, len(items))):
                items.pop()
        await FOREGROUND.turn()
