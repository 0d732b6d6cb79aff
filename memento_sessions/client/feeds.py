"""The notification feeds a Client hands out: `Subscription` (a session's events) and `Watch` (announcements).

Each is a bounded queue that the client's reader fills and one consumer drains; see docs/client.md.
A feed's `phase` says whether it was started and whether it ended; a Subscription's `link` says where it
stands with the server. The client and its feeds talk through public methods only: a feed asks its
client to `open_subscription`, `close_subscription`, `resync` or `open_watch`/`close_watch`; the client's
reader hands a feed what came (`deliver`), moves a Subscription's link (`asking`, `answered`, `detach`) and
ends it (`end`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import anyio
from websockets.asyncio.client import ClientConnection

from memento_sessions.client.errors import ConnectionLost, HistoryLost
from memento_sessions.client.wire import Result
from memento_sessions.logs import get_logger

if TYPE_CHECKING:
    from memento_sessions.client.core import Client

log = get_logger("memento_sessions.client")  # the logger name the client had as one module
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a subscription, as the server stored it (`event` has seq, actor, timestamp ...)."""

    session_id: str
    seq: int
    event: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.event.get("type", ""))



class Phase(Enum):
    """A feed's lifecycle: started once, ended once (a feed ended before it started never asks the server)."""

    NEW = "new"  # nothing asked of the server yet
    OPEN = "open"  # asked: the client's reader queues what comes
    ENDED = "ended"  # no more items after those queued (then the error it ended with, when there is one)


class Link(Enum):
    """Where a Subscription stands with the server; only the client's reader moves it."""

    NONE = "none"  # no server subscription on the live connection: the next subscribe asks after last_seq
    ASKED = "asked"  # a subscribe request is out on `connection`: events are held until its reply
    LIVE = "live"  # subscribed on `connection`: events are queued in seq order
    STALE = "stale"  # the queue overflowed or a gap showed: events are dropped until subscribed again


class Feed(Generic[T]):
    """A bounded queue of notifications read by one consumer; an error in it is raised when reached."""

    def __init__(self, client: Client, limit: int) -> None:
        self.client = client
        self._items: deque[T | BaseException] = deque()
        self._limit = limit
        self._wake = anyio.Event()
        self._phase = Phase.NEW

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        await self.start()
        return await self._next()

    @property
    def phase(self) -> Phase:
        """Whether the feed was started and whether it ended."""
        return self._phase

    async def start(self) -> None:
        """Ask the server for the notifications (once); raises its error, e.g. NotFound."""
        if self._phase is Phase.NEW:
            self._phase = Phase.OPEN
            try:
                await self._open()
            except BaseException:
                self.end()
                raise

    async def aclose(self) -> None:
        """Stop receiving; safe to call twice."""
        self._items.clear()
        self.end()
        await self._close()

    async def _open(self) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    @property
    def queued(self) -> int:
        """Items waiting for the consumer."""
        return len(self._items)

    @property
    def full(self) -> bool:
        return len(self._items) >= self._limit

    def _push(self, item: T | BaseException) -> None:
        self._items.append(item)
        self._wake.set()

    def end(self, error: BaseException | None = None) -> None:
        """No more items after those queued (then `error`, when given); the client calls it when it closes."""
        if error is not None and self._phase is not Phase.ENDED:
            self._items.append(error)
        self._phase = Phase.ENDED
        self._wake.set()

    async def _idle(self) -> None:
        """Called when the queue is empty and not ended: wait for a push."""
        self._wake = anyio.Event()
        await self._wake.wait()

    async def _next(self) -> T:
        while not self._items:
            if self._phase is Phase.ENDED:
                raise StopAsyncIteration
            await self._idle()
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item


class Subscription(Feed[Event]):
    """The events of one session in seq order, each once, across reconnects (`async with` or `async for`)."""

    def __init__(self, client: Client, session_id: str, since: int | None, epoch: str | None, limit: int) -> None:
        super().__init__(client, limit)
        self.session_id = session_id
        self.last_seq = since  # the seq to resume after: the last one queued, else where live began
        self.epoch = epoch
        self.last_checkpoint: Result | None = None
        self.resyncs = 0  # times the queue overflowed or a gap showed, and the stream was fetched again
        self._link = Link.NONE
        self._on: ClientConnection | None = None  # the connection the server subscription lives on
        self._early: list[Result] = []  # events that came before the subscribe reply (while ASKED)

    @property
    def link(self) -> Link:
        """Where the subscription stands with the server."""
        return self._link

    @property
    def connection(self) -> ClientConnection | None:
        """The connection the server subscription lives on (None when there is none)."""
        return self._on

    async def _open(self) -> None:
        await self.client.open_subscription(self)

    async def _close(self) -> None:
        await self.client.close_subscription(self)

    async def _idle(self) -> None:
        if self._link is not Link.STALE:
            await super()._idle()
            return
        with suppress(ConnectionLost):  # still disconnected: _next calls again; closed: _next ends
            await self.client.resync(self)

    def asking(self, ws: ClientConnection) -> None:
        """A subscribe request is about to go out on `ws`: hold events until its reply."""
        self._on, self._link, self._early = ws, Link.ASKED, []

    def detach(self) -> None:
        """The server subscription is gone (its connection dropped, or it was unsubscribed); a STALE one stays
        STALE, so what still comes is dropped until it is subscribed again."""
        self._on, self._early = None, []
        if self._link is not Link.STALE:
            self._link = Link.NONE

    def answered(self, result: Mapping[str, Any], asked_since: int | None) -> None:
        """The server's subscribe reply: note where we stand, then the events that came early."""
        early, self._early, self._link = self._early, [], Link.LIVE
        if result.get("recovered") is False and asked_since is not None:
            self._push(HistoryLost(self.session_id, asked_since, int(result["seq"]), result.get("epoch")))
            self.last_seq = None
        if self.last_seq is None:
            self.last_seq = int(result["seq"])
        self.epoch = result.get("epoch", self.epoch)
        for params in early:
            self.deliver(params)

    def recover(self, params: Result) -> None:
        """A `session.recovery` notification: the events delivered after the server's `seq` are not stored (a
        failover lost them) or belong to another epoch. Raises HistoryLost once, then goes on after `seq` in the
        new epoch. While a subscribe is asked, its reply says where we stand instead."""
        if self._link in (Link.ASKED, Link.STALE) or self._phase is Phase.ENDED:
            return
        seq = int(params["seq"])
        self._push(HistoryLost(self.session_id, self.last_seq, seq, params.get("epoch")))
        self.epoch, self.last_seq = params.get("epoch", self.epoch), seq

    def deliver(self, params: Result) -> None:
        """A `session.event` notification: queued when it is the next seq, held while ASKED, else dropped."""
        if self._link is Link.ASKED:
            self._early.append(params)
            return
        seq = int(params["seq"])
        epoch = params.get("epoch")
        dropping = self._link is Link.STALE or self._phase is Phase.ENDED
        if epoch and self.epoch and epoch != self.epoch and not dropping:
            # The session was created anew under this id while we were subscribed: its history restarted.
            self._push(HistoryLost(self.session_id, self.last_seq, seq, epoch))
            self.epoch, self.last_seq = epoch, 0
        if dropping or (self.last_seq is not None and seq <= self.last_seq):
            return
        if self.full or (self.last_seq is not None and seq != self.last_seq + 1):
            self._go_stale(seq)
            return
        self.last_seq = seq
        self._push(Event(self.session_id, seq, params["event"]))

    def _go_stale(self, seq: int) -> None:
        """Drop events until the consumer has caught up, then subscribe again after `last_seq`."""
        log.warning("subscription resyncs", session_id=self.session_id, seq=seq, last_seq=self.last_seq,
                    queued=self.queued)
        self._link = Link.STALE
        self.resyncs += 1
        self._wake.set()


class Watch(Feed[Result]):
    """`sessions.announce` notifications (`async with` or `async for`); see docs/client.md on gaps."""

    def __init__(self, client: Client, limit: int) -> None:
        super().__init__(client, limit)
        self.dropped = 0  # announcements dropped because the queue was full (the oldest go first)

    async def _open(self) -> None:
        await self.client.open_watch(self)

    async def _close(self) -> None:
        self.client.close_watch(self)

    def deliver(self, params: Result) -> None:
        """A `sessions.announce` notification: queued, the oldest dropped when the queue is full."""
        if self.full:
            self._items.popleft()
            self.dropped += 1
        self._push(params)
