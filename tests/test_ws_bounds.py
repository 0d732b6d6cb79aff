"""The WebSocket layer's bounds, over real sockets: nothing a client does grows the daemon without limit."""

from __future__ import annotations

import asyncio
import base64
import gc
import itertools
import json
import os
import socket
import struct
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.ws.connection import Connection
from memento_sessions.ws.subscriptions import Subscriptions
from tests.helpers import make_settings, sample, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio
SMALL_BUFFER = 64 * 1024


async def fill(port: int, namespace: str, count: int, size: int) -> str:
    """A new session holding `count` events of about `size` bytes each."""
    async with rpc(port, token("writer", namespace)) as peer:
        sid: str = (await peer.call("session.create", {}))["sessionId"]
        batch = min(count, max(1, 500_000 // size), 500)
        for start in range(0, count, batch):
            events = [{"type": "modified", "data": {"b": "x" * size}}] * min(batch, count - start)
            await peer.call("event.emitBatch", {"sessionId": sid, "events": events})
    return sid


def masked(text: str) -> bytes:
    """A client's (masked) text frame."""
    data, mask = text.encode(), os.urandom(4)
    size = len(data)
    head = bytes((0x81, 0x80 | size)) if size < 126 else struct.pack("!BBH", 0x81, 0xFE, size)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def upgrade_request(tok: str) -> bytes:
    """A WebSocket upgrade request for /ws with a bearer token."""
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {tok}\r\n\r\n").encode()


async def raw_client(port: int, tok: str, rcvbuf: int = 4096) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket client on a socket with a tiny receive buffer, past the handshake; it reads only if told."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(upgrade_request(tok))
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


def request(method: str, params: dict[str, Any], request_id: int = 1) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def subscriptions_of(daemon: Daemon) -> Subscriptions:
    assert daemon.services is not None
    handler: Any = daemon.services.registry.methods["sessions.watch"].handler
    while not hasattr(handler, "__self__"):  # coordination wraps every method: the inner one is in the closure
        handler = next(cell.cell_contents for cell in handler.__closure__ if callable(cell.cell_contents))
    subs: Subscriptions = handler.__self__
    return subs


def catch_up_tasks() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if "catch_up" in task.get_name()]


async def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


async def leave_during_replay(daemon: Daemon, namespace: str, sid: str) -> None:
    """Subscribe since 0, read nothing, wait until the replay is blocked on the full buffer, hang up."""
    _, writer = await raw_client(daemon.port, token("leaver", namespace))
    writer.write(masked(request("session.subscribe", {"sessionId": sid, "since": 0})))
    gateway = daemon.gateway
    assert gateway is not None
    await wait_until(lambda: any(c.queued_bytes >= SMALL_BUFFER // 4 for c in gateway.connections))
    writer.close()


async def test_clients_that_leave_during_a_replay_leave_nothing_behind(backend_urls: Endpoints, tmp_path: Path,
                                                                        namespace: str) -> None:
    """200 subscribers of a 5,000-event session hang up mid-replay: no Connection, task or memory stays."""
    async with running(make_settings(backend_urls, tmp_path, ws_send_buffer=SMALL_BUFFER)) as daemon:
        sid = await fill(daemon.port, namespace, 5000, 1000)
        gateway = daemon.gateway
        assert gateway is not None
        for _ in range(20):
            await leave_during_replay(daemon, namespace, sid)
        await wait_until(lambda: not gateway.connections)
        gc.collect()
        before = rss_bytes()
        for _ in range(180):
            await leave_during_replay(daemon, namespace, sid)
        await wait_until(lambda: not gateway.connections)
        await wait_until(lambda: not catch_up_tasks(), 5)
        # a closed connection's presence update ("left") holds it until written (slower on a cluster)
        await wait_until(lambda: not [t for t in asyncio.all_tasks() if "Presence._later" in t.get_name()], 5)
        gc.collect()
        assert [o for o in gc.get_objects() if isinstance(o, Connection)] == []
        assert subscriptions_of(daemon).conns == {}
        assert rss_bytes() - before < 16 * 1024 * 1024, "180 abandoned replays grew the daemon"


async def read_close_code(reader: asyncio.StreamReader) -> int:
    """Read server frames until the close frame; its code."""
    with anyio.fail_after(20):
        while True:
            first, second = await reader.readexactly(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack("!H", await reader.readexactly(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", await reader.readexactly(8))[0]
            payload = await reader.readexactly(size)
            if first & 0x0F == 0x8:
                code: int = struct.unpack("!H", payload[:2])[0]
                return code


async def test_live_frames_held_during_a_replay_count_against_the_buffer(backend_urls: Endpoints, tmp_path: Path,
                                                                         namespace: str) -> None:
    """A subscriber that reads nothing while its replay waits and live events pile up is closed with 4008."""
    async with running(make_settings(backend_urls, tmp_path, ws_send_buffer=SMALL_BUFFER)) as daemon:
        sid = await fill(daemon.port, namespace, 5000, 1000)
        gateway = daemon.gateway
        assert gateway is not None
        reader, writer = await raw_client(daemon.port, token("lazy", namespace))
        writer.write(masked(request("session.subscribe", {"sessionId": sid, "since": 0})))
        await wait_until(lambda: any(c.queued_bytes >= SMALL_BUFFER // 4 for c in gateway.connections))
        (lazy,) = gateway.connections
        peak = 0
        async with rpc(daemon.port, token("writer", namespace)) as peer:
            for _ in range(100):
                await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified",
                                                                           "data": {"b": "y" * 1000}}})
                peak = max(peak, lazy.queued_bytes)
        assert lazy.close_code == 4008
        assert peak <= SMALL_BUFFER
        assert await read_close_code(reader) == 4008
        writer.close()


async def test_a_frame_over_half_the_buffer_does_not_wedge_a_replay(backend_urls: Endpoints, tmp_path: Path,
                                                                     namespace: str) -> None:
    """Events of 38 KB and 62 KB (frames over half and near all of a 64 KiB buffer): a replay delivers them all."""
    async with running(make_settings(backend_urls, tmp_path, ws_send_buffer=SMALL_BUFFER)) as daemon:
        async with rpc(daemon.port, token("reader", namespace)) as peer:
            sid = (await peer.call("session.create", {}))["sessionId"]
            for count in (150, 240, 150, 240):
                entities = [f"{i:03d}" + "e" * 252 for i in range(count)]
                await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified",
                                                                           "changeInfo": {"entityIds": entities}}})
            await peer.call("session.subscribe", {"sessionId": sid, "since": 0})
            events = [(await peer.notification("session.event"))["params"] for _ in range(4)]
        assert [e["seq"] for e in events] == [1, 2, 3, 4]
        assert [len(e["event"]["changeInfo"]["entityIds"]) for e in events] == [150, 240, 150, 240]


async def test_unsubscribe_stops_an_inflight_replay_at_once(backend_urls: Endpoints, tmp_path: Path,
                                                            namespace: str) -> None:
    """No event after the unsubscribe's reply; a re-subscribe replays from 1 with nothing interleaved."""
    async with running(make_settings(backend_urls, tmp_path, ws_send_buffer=SMALL_BUFFER)) as daemon:
        sid = await fill(daemon.port, namespace, 3000, 300)
        async with rpc(daemon.port, token("reader", namespace)) as peer:
            await peer.call("session.subscribe", {"sessionId": sid, "since": 0})
            await peer.notification("session.event")
            await peer.call("session.unsubscribe", {"sessionId": sid})
            peer.notifications.clear()
            with anyio.move_on_after(0.5):
                await peer.notification("session.event", timeout=1)
            assert peer.notifications == [], "events arrived after the unsubscribe's reply"
            await peer.call("session.subscribe", {"sessionId": sid, "since": 0})
            seqs = [(await peer.notification("session.event"))["params"]["seq"] for _ in range(3000)]
        assert seqs == list(range(1, 3001))


async def test_subscriptions_per_connection_are_capped_and_cleaned_once(backend_urls: Endpoints, tmp_path: Path,
                                                                        namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path, ws_max_subscriptions=3)) as daemon:
        refused = sample("memento_ws_refused_total", {"reason": "too_many_subscriptions"})
        async with rpc(daemon.port, token("a", namespace)) as peer:
            sids = [(await peer.call("session.create", {}))["sessionId"] for _ in range(3)]
            assert (await peer.error("session.subscribe", {"sessionId": "missing"}))["code"] == -32004
            await peer.call("sessions.watch")
            await peer.call("session.subscribe", {"sessionId": sids[0]})
            await peer.call("session.subscribe", {"sessionId": sids[1]})
            error = await peer.error("session.subscribe", {"sessionId": sids[2]})
            assert error["code"] == -32009
            assert error["data"] == {"reason": "too_many_subscriptions", "limit": 3}
            await peer.call("session.subscribe", {"sessionId": sids[1], "since": 0})  # a re-subscribe is no new one
            for _ in range(50):
                await peer.call("session.unsubscribe", {"sessionId": sids[1]})
                await peer.call("session.subscribe", {"sessionId": sids[2]})
                await peer.call("session.unsubscribe", {"sessionId": sids[2]})
                await peer.call("session.subscribe", {"sessionId": sids[1]})
            gateway = daemon.gateway
            assert gateway is not None
            (conn,) = gateway.connections
            # one cleanup per part of the daemon that keeps state for the connection (subscriptions, presence,
            # mailbox), however many times it subscribed
            owners = Counter(cleanup.__qualname__.split(".")[0] for cleanup in conn._cleanups)
            assert owners["Subscriptions"] == 1 and set(owners.values()) == {1}
            assert len(subscriptions_of(daemon).conns[conn.conn_id]) == 3
        assert sample("memento_ws_refused_total", {"reason": "too_many_subscriptions"}) == refused + 1
        await wait_until(lambda: subscriptions_of(daemon).conns == {})


async def test_connections_past_the_cap_get_503(backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path, max_connections=2)) as daemon:
        refused = sample("memento_ws_refused_total", {"reason": "max_connections"})
        async with rpc(daemon.port, token("a", namespace)), rpc(daemon.port, token("b", namespace)):
            with pytest.raises(InvalidStatus) as third:
                async with connect(f"ws://127.0.0.1:{daemon.port}/ws?token={token('c', namespace)}"):
                    pass
            assert third.value.response.status_code == 503
            assert b"MEMENTO_MAX_CONNECTIONS" in third.value.response.body
        assert sample("memento_ws_refused_total", {"reason": "max_connections"}) == refused + 1
        gateway = daemon.gateway
        assert gateway is not None
        await wait_until(lambda: not gateway.connections)
        async with rpc(daemon.port, token("c", namespace)) as peer:
            assert (await peer.error("no.such"))["code"] == -32601


async def test_a_handshake_slower_than_the_timeout_is_dropped(backend_urls: Endpoints, tmp_path: Path,
                                                              namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path, handshake_timeout=0.5)) as daemon:
        refused = sample("memento_ws_refused_total", {"reason": "handshake_timeout"})
        reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
        writer.write(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = anyio.current_time()
        with anyio.fail_after(3):
            assert await reader.read() == b""
        assert 0.4 < anyio.current_time() - started < 2.0
        writer.close()
        assert sample("memento_ws_refused_total", {"reason": "handshake_timeout"}) == refused + 1
        async with rpc(daemon.port, token("a", namespace)) as peer:  # a prompt client is served past the deadline
            await anyio.sleep(0.8)
            assert (await peer.error("no.such"))["code"] == -32601


async def test_a_connection_is_closed_with_4001_when_its_token_expires(daemon: Daemon, namespace: str) -> None:
    async with connect(f"ws://127.0.0.1:{daemon.port}/ws?token={token('brief', namespace, ttl=2)}") as ws:
        with pytest.raises(ConnectionClosed) as closed:
            with anyio.fail_after(5):
                while True:
                    await ws.recv()
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "token expired")


async def test_a_client_that_hangs_up_before_its_replies_logs_no_traceback(daemon: Daemon, namespace: str,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    sid = await fill(daemon.port, namespace, 200, 2000)
    caplog.set_level("DEBUG")
    for _ in range(10):
        _, writer = await raw_client(daemon.port, token("rude", namespace))
        for i in range(20):
            writer.write(masked(request("session.get", {"sessionId": sid}, i)))
        await writer.drain()
        await anyio.sleep(0.05)
        writer.transport.abort()
    gateway = daemon.gateway
    assert gateway is not None
    await wait_until(lambda: not gateway.connections)
    await anyio.sleep(0.2)
    assert [r for r in caplog.records if r.exc_info or "Exception in ASGI" in r.getMessage()] == []


async def server_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next (unmasked, short) frame from the server: its opcode and payload."""
    head = await reader.readexactly(2)
    assert head[1] < 126, head
    return head[0] & 0x0F, await reader.readexactly(head[1])


def pong(payload: bytes) -> bytes:
    """A client's (masked) pong frame echoing `payload`."""
    mask = os.urandom(4)
    return bytes((0x8A, 0x80 | len(payload))) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_keepalive_pings_each_peer_every_interval_and_closes_one_that_stops_answering(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    """One task pings every connection (server/keepalive.py): a peer that answers stays, pinged about once an
    interval; one that stops answering is closed with 1011 within 2 intervals and 2 passes of its last pong."""
    interval = 0.5
    async with running(make_settings(backend_urls, tmp_path, ws_ping_interval=interval)) as daemon:
        reader, writer = await raw_client(daemon.port, token("pinged", namespace), rcvbuf=65536)
        pings: list[float] = []
        with anyio.move_on_after(3.2 * interval * 2):
            while True:
                opcode, payload = await server_frame(reader)
                assert opcode == 0x9, (opcode, payload)
                pings.append(anyio.current_time())
                writer.write(pong(payload))
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert len(pings) >= 4 and all(interval * 0.9 < gap < interval * 2 for gap in gaps), gaps
        stopped = anyio.current_time()  # from now on its pings go unanswered
        with anyio.fail_after(5):
            while (frame := await server_frame(reader))[0] == 0x9:
                pass
        assert frame[0] == 0x8 and struct.unpack("!H", frame[1][:2])[0] == 1011, frame
        assert anyio.current_time() - stopped < 2 * interval + 2 * interval / 4 + 0.5
        gateway = daemon.gateway
        assert gateway is not None
        await wait_until(lambda: not gateway.connections)
        writer.close()


async def test_requests_written_at_once_are_all_answered_in_order_and_reading_resumes(daemon: Daemon,
                                                                                      namespace: str) -> None:
    """The daemon pauses reading a connection only while a message waits for its reader (server/websocket.py):
    300 requests in one write (one bad) are answered in order, and the connection reads on afterwards."""
    reader, writer = await raw_client(daemon.port, token("flooder", namespace), rcvbuf=65536)
    listing = {"entityId": "file:nothing-here.py"}
    writer.write(b"".join(masked(request("no.such" if i == 150 else "lease.list", listing, i)) for i in range(300)))
    with anyio.fail_after(20):
        replies = [json.loads((await server_frame(reader))[1]) for _ in range(300)]
        assert [reply["id"] for reply in replies] == list(range(300))
        assert replies[150]["error"]["code"] == -32601 and replies[0]["result"]["leases"] == []
        for i in range(300, 305):  # one at a time: each is read with nothing queued before it
            writer.write(masked(request("lease.list", listing, i)))
            assert json.loads((await server_frame(reader))[1])["id"] == i
    writer.close()


def readers() -> list[asyncio.Task[Any]]:
    """The connections' reader tasks (ws/gateway.py runs one per connection beside its writer)."""
    return [task for task in asyncio.all_tasks() if getattr(task.get_coro(), "__qualname__", "") == "Gateway._read"]


async def test_a_connection_s_reader_ends_with_it_whichever_side_closes(daemon: Daemon, namespace: str) -> None:
    """A client that hangs up ends its writer, and a close by the daemon (here a token's expiry) ends its
    reader: neither task outlives the connection."""
    gateway = daemon.gateway
    assert gateway is not None
    before = len(readers())
    hangers = [await raw_client(daemon.port, token(f"hanger{n}", namespace)) for n in range(5)]
    async with connect(f"ws://127.0.0.1:{daemon.port}/ws?token={token('brief', namespace, ttl=2)}") as brief:
        assert len(readers()) == before + 6
        for _, writer in hangers:
            writer.transport.abort()
        await wait_until(lambda: len(readers()) == before + 1)
        with pytest.raises(ConnectionClosed), anyio.fail_after(5):
            await brief.recv()
    await wait_until(lambda: len(readers()) == before and not gateway.connections)


def blocking_clients(port: int, tokens: list[str]) -> list[socket.socket]:
    """WebSocket clients on blocking sockets, past the handshake (run in a thread: they allocate next to nothing
    in this process, whose heap the caller measures)."""
    clients = []
    for tok in tokens:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(upgrade_request(tok))
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101"), head
        clients.append(sock)
    return clients


async def test_an_idle_connection_keeps_under_24_kb_of_python_heap(daemon: Daemon, namespace: str) -> None:
    """The target: under 30 KB per idle connection (RSS). The Python heap's share, traced here (asyncio's loop),
    was 31 KB before the gateway's bare reader task and server/websocket.py's leaner protocol; it is about 21."""
    gateway = daemon.gateway
    assert gateway is not None
    count, already = 200, len(gateway.connections)
    tokens = [token(f"idle{n}", namespace) for n in range(count)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        clients = await anyio.to_thread.run_sync(blocking_clients, daemon.port, tokens)
        await wait_until(lambda: len(gateway.connections) == already + count)
        await anyio.sleep(0.3)
        gc.collect()
        each = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    for client in clients:
        client.close()
    await wait_until(lambda: len(gateway.connections) == already)
    assert each < 24 * 1024, f"{each:.0f} bytes per idle connection"
