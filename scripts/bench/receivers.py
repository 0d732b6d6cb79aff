"""Lean clients for the benchmarks: many subscribers or agents in one Python process cost the bench
more CPU than the servers it measures when each runs a full client library. These parse only what
they need (WebSocket frames from the daemon; RESP pushes from Redis) so the figures are the servers'.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
import time
from collections.abc import Callable
from typing import TypeVar

import hiredis

from memento_sessions.redisio.resp import Address, connect, pack

# An event's numbers are at most 1e12, and perf_counter_ns passes that after 17 minutes of uptime: the
# sender embeds its clock modulo WRAP (1,000 s), far longer than any latency measured.
WRAP = 10**12


def stamp() -> int:
    """The `t0` a sender embeds: perf_counter_ns modulo WRAP."""
    return time.perf_counter_ns() % WRAP


def since_stamp_ms(now: int, t0: int) -> float:
    """Milliseconds from the stamp `t0` to `now` (perf_counter_ns)."""
    return ((now % WRAP - t0) % WRAP) / 1e6


def latency_ms(payload: bytes, now: int) -> float | None:
    """Milliseconds since the `t0` (see stamp) the sender embedded in the payload."""
    at = payload.find(b'"t0":')
    if at < 0:
        return None
    end = at + 5
    while payload[end:end + 1].isdigit():
        end += 1
    return since_stamp_ms(now, int(payload[at + 5:end]))


def masked_frame(opcode: int, data: bytes) -> bytes:
    """A client-to-server frame (clients must mask)."""
    mask = os.urandom(4)
    head = bytes([0x80 | opcode])
    size = len(data)
    head += bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + struct.pack("!H", size)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


class Receiver(asyncio.Protocol):
    """Records up to `count` latency samples; `done` resolves with the last one."""

    def __init__(self, samples: list[float], count: int) -> None:
        self.samples, self.count, self.got = samples, count, 0
        self.done = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def record(self, latency: float) -> None:
        if self.got < self.count:
            self.samples.append(latency)
            self.got += 1
            if self.got == self.count and not self.done.done():
                self.done.set_result(None)


class LeanWebSocket(Receiver):
    """A WebSocket client that records the latency of every `session.event` text frame it gets."""

    def __init__(self, samples: list[float], count: int) -> None:
        super().__init__(samples, count)
        self.buffer = b""
        self.upgraded = asyncio.get_running_loop().create_future()
        self.replied = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.buffer += data
        if not self.upgraded.done():
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if not sep:
                return
            self.buffer = rest
            self.upgraded.set_result(head.startswith(b"HTTP/1.1 101"))
        self._frames(now)

    def _frames(self, now: int) -> None:
        while len(self.buffer) >= 2:
            opcode, size, start = self.buffer[0] & 0x0F, self.buffer[1] & 0x7F, 2
            if size == 126:
                if len(self.buffer) < 4:
                    return
                size, start = struct.unpack("!H", self.buffer[2:4])[0], 4
            elif size == 127:
                if len(self.buffer) < 10:
                    return
                size, start = struct.unpack("!Q", self.buffer[2:10])[0], 10
            if len(self.buffer) < start + size:
                return
            payload, self.buffer = self.buffer[start:start + size], self.buffer[start + size:]
            self._frame(opcode, payload, now)

    def _frame(self, opcode: int, payload: bytes, now: int) -> None:
        if opcode == 0x9 and self.transport is not None:  # ping: answer, or the daemon drops us
            self.transport.write(masked_frame(0xA, payload))
        elif opcode == 0x1 and b'"session.event"' in payload[:60]:
            latency = latency_ms(payload, now)
            if latency is not None:
                self.record(latency)
        elif opcode == 0x1 and not self.replied.done():
            self.replied.set_result(json.loads(payload))

    def send_text(self, text: str) -> None:
        assert self.transport is not None
        self.transport.write(masked_frame(0x1, text.encode()))


P = TypeVar("P", bound=LeanWebSocket)


class LeanCaller(LeanWebSocket):
    """A WebSocket client making one JSON-RPC call at a time, each a frame built once by the caller."""

    def __init__(self) -> None:
        super().__init__([], 0)
        self.waiting: asyncio.Future[bytes] | None = None

    def _frame(self, opcode: int, payload: bytes, now: int) -> None:
        # A notification is not the call's reply: a mailbox.send's sender gets its message's mailbox.receipt
        # pushed on the same connection, sometimes before the reply.
        if opcode == 0x1 and self.waiting is not None and not self.waiting.done() and b'"method"' not in payload[:32]:
            self.waiting.set_result(payload)
        else:
            super()._frame(opcode, payload, now)

    async def call(self, frame: bytes) -> bytes:
        """Send a masked request frame (see `masked_frame`) and return the reply's payload."""
        assert self.transport is not None
        self.waiting = asyncio.get_running_loop().create_future()
        self.transport.write(frame)
        return await self.waiting


class LeanFlood(LeanWebSocket):
    """A WebSocket client that writes requests without waiting (pipelined) and counts the replies.

    One load generator driving thousands of requests a second costs a write per request and a frame
    parse per reply, so the figure is the daemon's, not the bench's scheduling.
    """

    def __init__(self) -> None:
        super().__init__([], 0)
        self.sent = self.replies = self.errors = 0
        self.all_replied = asyncio.get_running_loop().create_future()

    def _frame(self, opcode: int, payload: bytes, now: int) -> None:
        if opcode != 0x1:
            super()._frame(opcode, payload, now)
            return
        self.replies += 1
        self.errors += b'"error"' in payload
        if self.replies >= self.sent and not self.all_replied.done():
            self.all_replied.set_result(None)

    def send_frame(self, frame: bytes) -> None:
        """Write one masked request frame (see `masked_frame`); its reply is counted when it comes."""
        assert self.transport is not None
        if self.all_replied.done():
            self.all_replied = asyncio.get_running_loop().create_future()
        self.sent += 1
        self.transport.write(frame)


async def upgraded(port: int, token: str, factory: Callable[[], P]) -> P:
    """Connect to the daemon's /ws and upgrade; returns once it answered 101."""
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(factory, "127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    assert proto.transport is not None
    proto.transport.write(
        f"GET /ws?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    if not await proto.upgraded:
        raise RuntimeError("the daemon refused the WebSocket upgrade")
    return proto


async def lean_subscriber(port: int, token: str, session_id: str, samples: list[float],
                          count: int) -> LeanWebSocket:
    """Connect, upgrade, subscribe; returns once the subscription is confirmed."""
    proto = await upgraded(port, token, lambda: LeanWebSocket(samples, count))
    proto.send_text(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.subscribe",
                                "params": {"sessionId": session_id}}))
    await proto.replied
    return proto


class LeanPubSub(Receiver):
    """A bare RESP subscriber (hiredis parser) recording the latency of each message's `t0`."""

    def __init__(self, samples: list[float], count: int) -> None:
        super().__init__(samples, count)
        self.reader = hiredis.Reader()
        self.subscribed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if isinstance(reply, hiredis.ReplyError) and not self.subscribed.done():
                self.subscribed.set_exception(RuntimeError(f"Redis refused the floor's subscriber: {reply}"))
            if not isinstance(reply, list):
                continue
            if reply[0] == b"subscribe" and not self.subscribed.done():
                self.subscribed.set_result(None)
            elif reply[0] == b"message":
                self.record((now - int(reply[2])) / 1e6)


async def lean_pubsub(url: str, channel: str, samples: list[float], count: int) -> LeanPubSub:
    """Connect (as the daemon's pub/sub connection does, TCP or unix socket) and SUBSCRIBE; returns once
    Redis confirmed."""
    address = Address.parse(url)
    proto = await connect(address, lambda: LeanPubSub(samples, count))
    assert proto.transport is not None
    if address.auth:  # the embedded Redis has a password: AUTH first, its +OK is not a list and is skipped
        proto.transport.write(pack(("AUTH", *address.auth)))
    proto.transport.write(pack(("SUBSCRIBE", channel)))
    await proto.subscribed
    return proto
