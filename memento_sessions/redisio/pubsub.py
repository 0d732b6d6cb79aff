"""The daemon's one pub/sub connection, raw: hiredis parses, pushes are handed over synchronously.

redis-py's PubSub turns every message into a dict through several Python layers and hands it over
in a task; here `data_received` parses with hiredis and calls the fan-out at once, so a frame goes
from this socket to every subscriber's transport in one loop turn. A PING every KEEPALIVE seconds
keeps the connection honest: with no data for three intervals it is dropped and the fan-out
reconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import hiredis
from redis.exceptions import ResponseError

from memento_sessions.logs import get_logger
from memento_sessions.redisio.resp import Address, connect, pack

log = get_logger(__name__)
KEEPALIVE = 10.0
Push = Callable[[list[Any]], None]


class Subscriber(asyncio.Protocol):
    """A connection in subscribe mode; `closed` resolves when it ends, with the reason."""

    def __init__(self, on_push: Push) -> None:
        self.on_push = on_push
        self.reader = hiredis.Reader(encoding="utf-8", replyError=ResponseError)
        loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[BaseException | None] = loop.create_future()
        self.last_data = loop.time()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        asyncio.get_running_loop().call_later(KEEPALIVE, self.keepalive)

    def data_received(self, data: bytes) -> None:
        self.last_data = asyncio.get_running_loop().time()
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if isinstance(reply, list):
                self.push(reply)
            elif isinstance(reply, ResponseError):
                log.warning("pub/sub connection refused a command", error=str(reply))
                self.close(reply)

    def push(self, reply: list[Any]) -> None:
        try:
            self.on_push(reply)
        except Exception:  # one bad listener must not take the connection down
            log.exception("pub/sub listener failed")

    def command(self, *args: str) -> None:
        if self.transport is not None and not self.closed.done():
            self.transport.write(pack(args))

    def keepalive(self) -> None:
        if self.closed.done():
            return
        if asyncio.get_running_loop().time() - self.last_data > 3 * KEEPALIVE:
            self.close(TimeoutError(f"no data from Redis for {3 * KEEPALIVE:.0f}s"))
            return
        self.command("PING")
        asyncio.get_running_loop().call_later(KEEPALIVE, self.keepalive)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)

    def close(self, reason: BaseException | None = None) -> None:
        """Drop the connection; safe to call twice."""
        if not self.closed.done():
            self.closed.set_result(reason)
        if self.transport is not None:
            self.transport.close()


async def open_subscriber(url: str, on_push: Push) -> Subscriber:
    """Connect (and AUTH, if the URL has credentials) a connection ready for SUBSCRIBE."""
    address = Address.parse(url)
    subscriber = await connect(address, lambda: Subscriber(on_push))
    if address.auth:
        subscriber.command("AUTH", *address.auth)
    return subscriber
