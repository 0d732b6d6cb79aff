"""One client's connection: a bounded send buffer that fan-out appends to, and the writer that drains it.

`notify` never blocks; a client whose buffer overflows is closed with 4008 instead of slowing the
publisher (see docs/flow-control.md). When uvicorn's transport takes data, frames go straight to it
(ws/frames.py); otherwise through ASGI `send`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Callable

import anyio
from starlette.types import Send

from memento_sessions.auth import Identity
from memento_sessions.logs import get_logger
from memento_sessions.metrics import WS_MESSAGES_SENT, WS_SLOW_CLOSES
from memento_sessions.ws.frames import DirectWriter, take_batch

log = get_logger(__name__)
SLOW_CONSUMER = 4008
CLOSE_TIMEOUT = 5.0


class _Tally:
    """Frames written straight from `notify`, added to WS_MESSAGES_SENT once per loop turn.

    A fan-out to 1,000 subscribers writes 1,000 frames in one turn; a Counter.inc each (its lock, ~0.7 us)
    was a tenth of a direct write's Python, so they are counted here and added together.
    """

    def __init__(self) -> None:
        self.count = 0
        self.due_on: asyncio.AbstractEventLoop | None = None  # the loop a flush is queued on

    def add(self) -> None:
        loop = asyncio.get_running_loop()
        if self.due_on is not loop:  # also when a loop ended with a flush queued: this one queues its own
            self.due_on = loop
            loop.call_soon(self.flush)
        self.count += 1

    def flush(self) -> None:
        WS_MESSAGES_SENT.inc(self.count)
        self.count, self.due_on = 0, None


_SENT = _Tally()


class Connection:
    """One authenticated client; `notify` never blocks, the writer drains the buffer.

    The buffer bound covers everything the daemon keeps for this client: frames queued for the writer and
    live frames a subscription holds back while it replays (`hold`). One frame always fits in an empty
    buffer, whatever its size, so a frame bigger than the buffer neither wedges a replay nor closes a
    client that reads everything.
    """

    # Slots: the fan-out reads a handful of these per delivery, across thousands of connections whose objects
    # are rarely in cache; a slot is read at a fixed offset where a __dict__ is a hash lookup (and each idle
    # connection keeps a few hundred bytes less).
    __slots__ = ("_after_reply", "_cleanups", "_direct", "_drained", "_held", "_limit", "_out", "_queued", "_send",
                 "_sending", "_wakeup", "close_code", "close_reason", "conn_id", "identity")

    def __init__(self, send: Send, identity: Identity, limit_bytes: int) -> None:
        self.conn_id = uuid.uuid4().hex[:12]
        self.identity = identity
        self._send = send
        self._direct = DirectWriter.behind(send)
        self._sending = False
        self._limit = limit_bytes
        self._out: deque[str] = deque()
        self._queued = 0
        self._held = 0
        self._wakeup = anyio.Event()
        self._drained: anyio.Event | None = None  # made by a replay waiting for room: most clients never wait
        self._cleanups: list[Callable[[], None]] = []
        self._after_reply: list[Callable[[], None]] = []
        self.close_code: int | None = None
        self.close_reason = ""

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting for the writer plus bytes held back by replaying subscriptions."""
        return self._queued + self._held

    def _fits(self, nbytes: int) -> bool:
        used = self._queued + self._held
        return used == 0 or used + nbytes <= self._limit

    def notify(self, frame: str) -> None:
        """Queue a frame; a client whose buffer would overflow is closed as a slow consumer."""
        if self.close_code is not None:
            return
        if not self._fits(len(frame)):
            self._overflow()
            return
        if not self._out and not self._sending and self._direct is not None and self._direct.write_now(frame):
            _SENT.add()  # nothing queued or in flight: order is kept
            return
        self._out.append(frame)
        self._queued += len(frame)
        self._wakeup.set()

    def hold(self, nbytes: int) -> bool:
        """Count `nbytes` a subscription keeps for later against the buffer; False (closed with 4008) past it."""
        if self.close_code is not None:
            return False
        if not self._fits(nbytes):
            self._overflow()
            return False
        self._held += nbytes
        return True

    def release(self, nbytes: int) -> None:
        """Give back bytes from `hold` (delivered or dropped)."""
        self._held = max(0, self._held - nbytes)

    def _overflow(self) -> None:
        WS_SLOW_CLOSES.inc()
        log.warning("closing slow consumer", conn_id=self.conn_id, queued_bytes=self.queued_bytes)
        self.close(SLOW_CONSUMER, "slow consumer")

    def has_room(self, nbytes: int) -> bool:
        """True when `nbytes` more fit in half the buffer, or it is empty (replay waits on this)."""
        return self._queued == 0 or self._queued + self._held + nbytes <= self._limit // 2

    async def wait_room(self, nbytes: int) -> None:
        """Wait until the writer has drained enough for `nbytes` more (returns at once once closed)."""
        while not self.has_room(nbytes) and self.close_code is None:
            self._drained = anyio.Event()
            await self._drained.wait()

    def _wake_replays(self) -> None:
        if self._drained is not None:
            self._drained.set()

    def on_close(self, cleanup: Callable[[], None]) -> None:
        """Run `cleanup` when the connection ends (the subscriptions register one per connection)."""
        self._cleanups.append(cleanup)

    def after_reply(self, start: Callable[[], None]) -> None:
        """Run `start` once the reply to the request being handled is queued: a method's wrappers may
        still await after its handler returns, and a replay must not overtake the reply."""
        self._after_reply.append(start)

    def replied(self) -> None:
        """The current request is answered: start what waited for its reply."""
        if not self._after_reply:  # nearly every request: no new list
            return
        started, self._after_reply = self._after_reply, []
        for start in started:
            start()

    def close(self, code: int, reason: str = "") -> None:
        """Ask the writer to send a close frame after what is queued; safe to call twice."""
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
            if code == SLOW_CONSUMER:
                self._out.clear()
                self._queued = 0
            self._wakeup.set()
            self._wake_replays()

    def gone(self, code: int) -> None:
        """The client is gone: nothing more will be sent; wake the writer and every replay waiting for room."""
        if self.close_code is None:
            self.close_code = code
        self._out.clear()
        self._queued = 0
        self._wakeup.set()
        self._wake_replays()

    async def writer(self) -> None:
        """Send queued frames in order, then the close frame; a client that left ends it quietly."""
        try:
            await self._write()
        except OSError as exc:  # uvicorn's ClientDisconnected: leaving before a reply is normal
            log.debug("client left before its frames were sent", error=type(exc).__name__)
            self.gone(self.close_code or 1006)

    async def _write(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
            while self._out:
                await self._send_some()
                self._wake_replays()
            if self.close_code is not None:
                with anyio.move_on_after(CLOSE_TIMEOUT):
                    await self._send({"type": "websocket.close", "code": self.close_code, "reason": self.close_reason})
                return

    async def _send_some(self) -> None:
        """A batch straight to the transport when it takes data, else one frame through ASGI `send`."""
        if self._direct is not None and self._direct.ready():
            batch, size = take_batch(self._out)
            self._queued -= size
            self._direct.write(batch)
            WS_MESSAGES_SENT.inc(len(batch))
            return
        frame = self._out.popleft()
        self._queued -= len(frame)
        self._sending = True  # popped but not yet written: notify must queue behind it
        try:
            await self._send({"type": "websocket.send", "text": frame})
        finally:
            self._sending = False
        WS_MESSAGES_SENT.inc()

    def run_cleanups(self) -> None:
        """Detach from every subscription; safe to call twice."""
        cleanups, self._cleanups = self._cleanups, []
        for cleanup in cleanups:
            cleanup()
