"""uvicorn's sansio WebSocket protocol, keeping less per connection: at 10,000 idle connections what each one
keeps is the daemon's memory (the target: under 30 KB a connection, docs/benchmarks.md).

- The ASGI receive queue is a list and a future made only while `receive` waits, instead of an asyncio.Queue
  (three deques of ~760 bytes each, and an Event with a fourth).
- `writable` is a flag with a future made only while a send waits for the transport, not an asyncio.Event.
- Once the WebSocket is accepted, the handshake's request and response (their headers) and the scope's copy
  of the headers are dropped: nothing reads them again.

Together about 5 KB a connection. It is a subclass of uvicorn's, so ws/frames.py still writes straight
to its transport (it checks for uvicorn's class). Use it with `uvicorn.Config(ws=WebSocketsSansIOProtocol)`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.websockets import websockets_sansio_impl as sansio


class Inbox:
    """The three calls uvicorn makes of its receive queue (put_nowait, get, empty), for one reader at a time:
    the gateway's. uvicorn pauses reading while anything is queued, so it holds a message or two."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)


class Flag:
    """asyncio.Event's set, clear, is_set and wait, with no deque: one future, made only while a task waits."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = True
        self._waiter: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        if self._waiter is not None:
            if not self._waiter.done():
                self._waiter.set_result(None)
            self._waiter = None

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if not self._set:
            if self._waiter is None:
                self._waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._waiter)  # shielded: one waiter cancelled leaves the others waiting
        return True


class WebSocketsSansIOProtocol(sansio.WebSocketsSansIOProtocol):
    """uvicorn's protocol with a lighter receive queue and writable flag, and the handshake dropped once done."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue: Any = Inbox()
        self.writable: Any = Flag()

    def send_receive_event_to_app(self) -> None:
        """uvicorn's, pausing reading only when a message is already queued for the reader.

        uvicorn pauses reading at every message and resumes it when the reader takes it: two epoll changes (two
        io_uring_enter calls under uvloop) per request of a client that waits for each reply. With the reader
        waiting, the message is handed over and reading stays on; a message arriving while one is still queued
        pauses it as before, so what is queued stays within one read. `read_paused` is uvicorn's flag: True makes
        it skip the pause, and its `receive` then resumes a transport that is reading, which does nothing.
        """
        self.read_paused = self.queue.empty()
        super().send_receive_event_to_app()

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            del self.request, self.response
            self.scope["headers"] = []
