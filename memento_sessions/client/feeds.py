"""The notification feeds a Client hands out: `Subscription` (a session's events) and `Watch` (announcements).

Each is a bounded queue that the client's reader fills and one consumer drains; see docs/client.md.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
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



class _Feed(Generic[T]):
    """A bounded queue of notifications read by one consumer; an error in it is raised when reached."""

    def __init__(self, client: Client, limit: int) -> None:
        self.client = client
        self._items: deque[T | BaseException] = deque()
        self._limit = limit
        self._wake = anyio.Event()
        self._ended = False
        self._started = False

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

    async def start(self) -> None:
        """Ask the server for the notifications (once); raises its error, e.g. NotFound."""
        if not self._started:
            self._started = True
            try:
                await self._open()
            except BaseException:
                self._end()
                raise

    async def aclose(self) -> None:
        """Stop receiving; safe to call twice."""
        self._items.clear()
        self._end()
        await self._close()

    async def _open(self) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    @property
    def full(self) -> bool:
        return len(self._items) >= self._limit

    def _push(self, item: T | BaseException) -> None:
        self._items.append(item)
        self._wake.set()

    def _end(self, error: BaseException | None = None) -> None:
        """No more items after those queued (then `error`, when given)."""
        if error is not None and not self._ended:
            self._items.append(error)
        self._ended = True
        self._wake.set()

    async def _idle(self) -> None:
        """Called when the queue is empty and not ended: wait for a push."""
        self._wake = anyio.Event()
        await self._wake.wait()

    async def _next(self) -> T:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            await self._idle()
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item


class Subscription(_Feed[Event]):
    """The events of one session in seq order, each once, across reconnects (`async with` or `async for`)."""

    def __init__(self, client: Client, session_id: str, since: int | None, epoch: str | None, limit: int) -> None:
        super().__init__(client, limit)
        self.session_id = session_id
        self.last_seq = since  # the seq to resume after: the last one queued, else where live began
        self.epoch = epoch
        self.last_checkpoint: Result | None = None
        self.resyncs = 0  # times the queue overflowed or a gap showed, and the stream was fetched again
        self._on: ClientConnection | None = None  # the connection the server subscription lives on
        self._early: list[Result] | None = None  # events that came before the subscribe reply
        self._stale = False

    async def _open(self) -> None:
        await self.client._open_subscription(self)

    async def _close(self) -> None:
        await self.client._close_subscription(self)

    async def _idle(self) -> None:
        if not self._stale:
            await super()._idle()
            return
        with suppress(ConnectionLost):  # still disconnected: _next calls again; closed: _next ends
            await self.client._resync(self)

    def _expect(self, ws: ClientConnection) -> None:
        """A subscribe request is about to go out on `ws`: hold events until its reply."""
        self._on, self._early, self._stale = ws, [], False

    def _detach(self) -> None:
        self._on, self._early = None, None

    def _activate(self, result: Mapping[str, Any], asked_since: int | None) -> None:
        """The server's subscribe reply: note where we stand, then the events that came early."""
        early, self._early = self._early or [], None
        if result.get("recovered") is False and asked_since is not None:
            self._push(HistoryLost(self.session_id, asked_since, int(result["seq"]), result.get("epoch")))
            self.last_seq = None
        if self.last_seq is None:
            self.last_seq = int(result["seq"])
        self.epoch = result.get("epoch", self.epoch)
        for params in early:
            self._on_event(params)

    def _on_event(self, params: Result) -> None:
        if self._early is not None:
            self._early.append(params)
            return
        seq = int(params["seq"])
        epoch = params.get("epoch")
        if epoch and self.epoch and epoch != self.epoch and not self._stale and not self._ended:
            # The session was created anew under this id while we were subscribed: its history restarted.
            self._push(HistoryLost(self.session_id, self.last_seq, seq, epoch))
            self.epoch, self.last_seq = epoch, 0
        if self._stale or self._ended or (self.last_seq is not None and seq <= self.last_seq):
            return
        if self.full or (self.last_seq is not None and seq != self.last_seq + 1):
            self._go_stale(seq)
            return
        self.last_seq = seq
        self._push(Event(self.session_id, seq, params["event"]))

    def _go_stale(self, seq: int) -> None:
        """Drop events until the consumer has caught up, then subscribe again after `last_seq`."""
        log.warning("subscription resyncs", session_id=self.session_id, seq=seq, last_seq=self.last_seq,
                    queued=len(self._items))
        self._stale = True
        self.resyncs += 1
        self._wake.set()


class Watch(_Feed[Result]):
    """`sessions.announce` notifications (`async with` or `async for`); see docs/client.md on gaps."""

    def __init__(self, client: Client, limit: int) -> None:
        super().__init__(client, limit)
        self.dropped = 0  # announcements dropped because the queue was full (the oldest go first)

    async def _open(self) -> None:
        await self.client._open_watch(self)

    async def _close(self) -> None:
        self.client._watches.discard(self)  # the server has no unwatch: it announces until the connection ends

    def _announce(self, params: Result) -> None:
        if self.full:
            self._items.popleft()
            self.dropped += 1
        self._push(params)
