"""Frames written straight to the transport are the frames a WebSocket client decodes, in order."""

from __future__ import annotations

from collections import deque

import pytest
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from memento_sessions.server.daemon import Daemon
from memento_sessions.ws.connection import Connection
from memento_sessions.ws.frames import take_batch, text_frame
from tests.helpers import token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 200_000])
def test_text_frame_round_trips_through_the_websockets_parser(size: int) -> None:
    payload = ("é" * (size // 2)).encode()[:size] if size else b""
    reader = StreamReader()
    reader.feed_data(text_frame(payload))
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        frame = done.value
    assert (frame.opcode, frame.fin, frame.data) == (Opcode.TEXT, True, payload)


def test_take_batch_keeps_order_and_bounds_size() -> None:
    queue = deque(["a" * 100, "b" * 100, "c" * 100, "d"])
    assert take_batch(queue, limit=250) == (["a" * 100, "b" * 100], 200)
    assert take_batch(queue, limit=10) == (["c" * 100], 100), "one frame always goes, even past the limit"
    assert list(queue) == ["d"]


async def test_direct_writes_are_used_and_keep_order(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        await b.call("session.subscribe", {"sessionId": sid})
        assert daemon.gateway is not None
        conns: list[Connection] = list(daemon.gateway.connections)
        assert all(c._direct is not None for c in conns), "uvicorn's sansio protocol is found behind send"
        await a.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified"}] * 300})
        seqs = [(await b.notification("session.event"))["params"]["seq"] for _ in range(300)]
    assert seqs == list(range(1, 301))
