"""WebSocket keepalive for every connection from one task: a dead peer is closed within 2 intervals and 2 passes.

uvicorn pings each connection from timers of its own: a loop timer until the ping, another for the pong's
deadline, a random payload and websockets' framing each time. With 10,000 idle connections and the 20 s
interval that is 500 pings a second, each its own loop wake-up, and it was the largest share of an idle
daemon's CPU. Here uvicorn's keepalive is off (`ws_ping_interval=None`) and one task passes over the
connections PASSES times an interval: it pings, with one frame made per pass, each connection whose last
ping is an interval old, and closes each whose ping an interval old is still unanswered (uvicorn's own
`keepalive_timeout`: close code 1011). The pong still goes through uvicorn's `handle_pong`, which clears
the pending payload: the state is uvicorn's (`pending_ping_payload`, `ping_sent_at`), nothing is added
per connection.

A peer that dies just after answering is pinged at most an interval and a pass later and closed at most an
interval and a pass after that: 50 s at the default 20 s (a dead peer is found within 60 s).
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Iterable
from typing import Any

import anyio
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

PASSES = 4  # passes over the connections per interval


async def keep_alive(connections: set[Any], interval: float) -> None:
    """Forever: ping and time out the WebSocket connections among uvicorn's `connections`."""
    loop = asyncio.get_running_loop()
    while True:
        await anyio.sleep(interval / PASSES)
        sweep(connections, interval, loop.time())


def sweep(connections: Iterable[Any], interval: float, now: float) -> None:
    """One pass: ping those due, close those whose ping went unanswered for `interval`."""
    payload = struct.pack("!I", random.getrandbits(32))
    ping = b"\x89\x04" + payload  # a final, unmasked ping frame with a 4-byte payload
    for protocol in list(connections):  # a copy: a close may drop one from the set
        if not isinstance(protocol, WebSocketsSansIOProtocol) or not protocol.handshake_complete \
                or protocol.close_sent or protocol.transport.is_closing():
            continue
        if protocol.ping_sent_at == 0.0:  # accepted since the last pass: its first ping an interval from now
            protocol.ping_sent_at = now
        elif now - protocol.ping_sent_at < interval:
            continue
        elif protocol.pending_ping_payload is not None:
            protocol.keepalive_timeout()
        else:
            protocol.pending_ping_payload, protocol.ping_sent_at = payload, now
            protocol.transport.write(ping)
