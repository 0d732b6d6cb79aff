"""`Client` against the real daemon and Redis: typed calls, errors, concurrency, resume across real cuts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from anyio.abc import TaskStatus

from memento_sessions import keys
from memento_sessions.client import (
    Client,
    ClientClosed,
    ConnectionLost,
    HistoryLost,
    Link,
    Phase,
    RequestTimeout,
    RequestTooLarge,
    Subscription,
    Unauthorized,
)
from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.errors import Conflict, Forbidden, InvalidParams, MethodNotFound, NotFound, RpcError
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.settings import Settings
from tests.helpers import make_settings, sample, token

pytestmark = pytest.mark.anyio
FAST = (0.01, 0.2)


def url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/ws"


@asynccontextmanager
async def client(port: int, agent: str, namespace: str, **options: Any) -> AsyncIterator[Client]:
    options.setdefault("backoff", FAST)
    async with Client(url(port), token(agent, namespace), **options) as c:
        yield c


async def take(sub: Subscription, last: int) -> list[int]:
    """Seqs the subscription yields until `last`."""
    seqs: list[int] = []
    with anyio.fail_after(30):
        async for event in sub:
            seqs.append(event.seq)
            if event.seq >= last:
                break
    return seqs


async def emit_stream(c: Client, sid: str, count: int, batch: int = 10, pause: float = 0.002, first: int = 0) -> None:
    """Events e<first>.. in batches, with pauses, so a subscriber sees them arrive while it is cut."""
    for start in range(first, first + count, batch):
        events = [{"type": "modified", "id": f"e{i}", "data": {"i": i}} for i in range(start, start + batch)]
        await c.emit_batch(sid, events)
        await anyio.sleep(pause)


def cut(c: Client) -> None:
    """Drop the TCP connection under the client, as a network failure does."""
    assert c.connection is not None
    c.connection.transport.abort()


async def test_round_trips_return_the_servers_results(daemon: Daemon, namespace: str) -> None:
    async with client(daemon.port, "alice", namespace) as alice, client(daemon.port, "bob", namespace) as bob:
        created = await alice.create_session(["fn:a"], labels={"task": "t1"})
        sid = created["sessionId"]
        assert created["state"] == "working" and created["seq"] == 1 and created["agentIds"] == ["alice"]
        assert sorted((await bob.join(sid))["agentIds"]) == ["alice", "bob"]
        assert await bob.emit(sid, {"type": "broke", "id": "b1"}) == {"seq": 2, "duplicate": False}
        assert await bob.emit(sid, {"type": "broke", "id": "b1"}) == {"seq": 2, "duplicate": True}
        assert (await alice.emit_batch(sid, [{"type": "modified"}, {"type": "test_pass"}]))["seqs"] == [3, 4]
        got = await bob.get(sid, since=1, limit=2)
        assert [e["seq"] for e in got["events"]] == [2, 3] and got["session"]["state"] == "working"
        assert [e["actor"] for e in got["events"]] == ["bob", "alice"]
        assert (await bob.get(sid, condensed=True))["counts"]["broke"] == 1
        assert [s["sessionId"] for s in await bob.list_sessions(agent_id="bob")] == [sid]
        assert await bob.leave(sid) == {}
        assert await bob.list_sessions(agent_id="bob") == []


async def test_server_errors_raise_their_typed_exceptions(daemon: Daemon, namespace: str) -> None:
    async with client(daemon.port, "alice", namespace) as alice:
        with pytest.raises(NotFound) as missing:
            await alice.get("no-such-session")
        assert missing.value.code == -32004 and isinstance(missing.value, RpcError)
        sid = (await alice.create_session(session_id="fixed-1"))["sessionId"]
        with pytest.raises(Conflict) as exists:
            await alice.create_session(session_id="fixed-1")
        assert exists.value.code == -32009
        with pytest.raises(InvalidParams) as bad:
            await alice.emit(sid, {"type": "Bad Type", "impact": {"severity": "huge"}})
        assert {e["field"] for e in bad.value.data} == {"event.type", "event.impact.severity"}
        with pytest.raises(Forbidden) as forbidden:
            await alice.emit(sid, {"type": "modified", "actor": "mallory"})
        assert forbidden.value.code == -32001
        with pytest.raises(MethodNotFound):
            await alice.call("no.such.method")
        with pytest.raises(RequestTooLarge):
            await alice.emit(sid, {"type": "modified", "data": {"x": "y" * (1024 * 1024)}})
        assert (await alice.get(sid))["session"]["seq"] == 0, "no failed call wrote anything"
        assert alice.reconnects == 0, "no error closed the connection"
    async with client(daemon.port, "reader", namespace) as reader:
        scope = token("reader", namespace, scope="sessions:read")
        async with Client(url(daemon.port), scope) as read_only:
            with pytest.raises(Forbidden) as no_scope:
                await read_only.emit(sid, {"type": "modified"})
            assert no_scope.value.data == {"scope": "sessions:write"}
        assert (await reader.get(sid))["session"]["seq"] == 0


async def test_a_refused_token_raises_unauthorized_with_the_servers_reason(daemon: Daemon, namespace: str) -> None:
    with pytest.raises(Unauthorized) as forged:
        async with Client(url(daemon.port), "not-a-token"):
            pass
    assert str(forged.value) == "handshake refused with HTTP 401: invalid token"
    with pytest.raises(Unauthorized) as expired:
        async with Client(url(daemon.port), token("old", namespace, ttl=-10)):
            pass
    assert str(expired.value) == "handshake refused with HTTP 401: token expired"


async def test_a_token_expiring_closes_with_4001_and_the_client_goes_on_with_a_fresh_one(daemon: Daemon,
                                                                                         namespace: str) -> None:
    issued: list[str] = []

    def fresh() -> str:
        issued.append(token("brief", namespace, ttl=2))
        return issued[-1]

    async with Client(url(daemon.port), fresh) as brief:
        sid = (await brief.create_session())["sessionId"]
        with anyio.fail_after(8):
            while brief.reconnects < 1:
                await anyio.sleep(0.05)
        assert brief.last_close_code == 4001
        assert (await brief.get(sid, limit=1))["session"]["seq"] == 0
    assert len(issued) >= 2


async def wait_seq(c: Client, sid: str, seq: int) -> None:
    """Until the server has stored `seq` in the session."""
    with anyio.fail_after(10):
        while (await c.get(sid, limit=1))["session"]["seq"] < seq:
            await anyio.sleep(0.005)


async def test_two_hundred_requests_in_flight_on_one_connection(daemon: Daemon, namespace: str) -> None:
    async with client(daemon.port, "alice", namespace) as alice, client(daemon.port, "obs", namespace) as obs:
        sid = (await alice.create_session())["sessionId"]
        replies: dict[int, dict[str, Any]] = {}

        async def emit(i: int) -> None:
            replies[i] = dict(await alice.emit(sid, {"type": "modified", "id": f"c{i}"}))

        assert alice.connection is not None and daemon.gateway is not None
        alice.connection.transport.pause_reading()  # no reply gets through until all 200 are applied
        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(emit, i)
            await wait_seq(obs, sid, 200)
            assert replies == {}, "all 200 were in flight at once"
            alice.connection.transport.resume_reading()
        assert sorted(r["seq"] for r in replies.values()) == list(range(1, 201))
        events = (await alice.get(sid))["events"]
        assert {e["id"]: e["seq"] for e in events} == {f"c{i}": r["seq"] for i, r in replies.items()}, \
            "each reply went to the request that asked"
        assert alice.reconnects == 0 and len(daemon.gateway.connections) == 2


async def test_a_request_without_reply_times_out_and_its_late_reply_is_dropped(daemon: Daemon,
                                                                              namespace: str) -> None:
    async with client(daemon.port, "alice", namespace, request_timeout=0.3) as alice:
        sid = (await alice.create_session())["sessionId"]
        assert alice.connection is not None
        alice.connection.transport.pause_reading()
        with pytest.raises(RequestTimeout):
            await alice.emit(sid, {"type": "broke"})
        alice.connection.transport.resume_reading()
        assert (await alice.get(sid))["session"]["state"] == "broken", "applied; only the reply came late"
        assert await alice.emit(sid, {"type": "test_pass"}) == {"seq": 2, "duplicate": False}


async def test_a_reply_lost_in_a_cut_fails_the_call_and_an_emit_with_an_id_is_retried(daemon: Daemon,
                                                                                     namespace: str) -> None:
    async with client(daemon.port, "alice", namespace) as alice, client(daemon.port, "obs", namespace) as obs:
        sid = (await alice.create_session())["sessionId"]

        async def applied_then_cut(seq: int) -> None:
            """The server stored the emit, but its reply is lost with the connection."""
            with anyio.fail_after(5):
                while (await obs.get(sid, limit=1))["session"]["seq"] < seq:
                    await anyio.sleep(0.005)
            cut(alice)

        assert alice.connection is not None
        alice.connection.transport.pause_reading()
        async with anyio.create_task_group() as tg:
            tg.start_soon(applied_then_cut, 1)
            with pytest.raises(ConnectionLost):
                await alice.emit(sid, {"type": "modified"})
        await alice.get(sid)  # reconnected
        alice.connection.transport.pause_reading()
        async with anyio.create_task_group() as tg:
            tg.start_soon(applied_then_cut, 2)
            assert await alice.emit(sid, {"type": "modified", "id": "once"}) == {"seq": 2, "duplicate": True}
        assert alice.reconnects == 2
        assert [e["seq"] for e in (await obs.get(sid))["events"]] == [1, 2], "stored once, no second write"


async def test_an_encoded_batch_is_stored_as_sent_retried_when_every_event_leads_with_its_id(daemon: Daemon,
                                                                                            namespace: str) -> None:
    async with client(daemon.port, "alice", namespace) as alice, client(daemon.port, "obs", namespace) as obs:
        sid = (await alice.create_session())["sessionId"]
        events = [b'{"id":"a1","type":"modified","data":{"text":"\xc3\xbc \\u00e9"}}', b'{"id":"a2","type":"broke"}']
        assert await alice.emit_batch_encoded(sid, events) == {"seqs": [1, 2]}
        assert await alice.emit_batch_encoded(sid, events) == {"seqs": [1, 2], "duplicates": [1, 2]}
        stored = (await obs.get(sid))["events"]
        assert [(e["id"], e["type"]) for e in stored] == [("a1", "modified"), ("a2", "broke")]
        assert stored[0]["data"] == {"text": "\u00fc \u00e9"}, "UTF-8 and escapes reach the daemon as sent"
        with pytest.raises(InvalidParams) as bad:  # the daemon checks an encoded event as any other
            await alice.emit_batch_encoded(sid, [b'{"id":"a3","type":"modified","data":{"x":NaN}}'])
        assert bad.value.data[0]["field"].startswith("events.0.data")
        with pytest.raises(RequestTooLarge):
            await alice.emit_batch_encoded(sid, [b'{"id":"a4","type":"modified","data":{"x":"%b"}}' % (b"y" * 2**20)])

        async def applied_then_cut(seq: int) -> None:
            with anyio.fail_after(5):
                while (await obs.get(sid, limit=1))["session"]["seq"] < seq:
                    await anyio.sleep(0.005)
            cut(alice)

        for event, seq in ((b'{"type":"modified","id":"late"}', 3), (b'{"id":"once","type":"modified"}', 4)):
            assert alice.connection is not None
            alice.connection.transport.pause_reading()
            async with anyio.create_task_group() as tg:
                tg.start_soon(applied_then_cut, seq)
                if seq == 3:  # an id that is not the first key: not known to be idempotent, so not sent again
                    with pytest.raises(ConnectionLost):
                        await alice.emit_batch_encoded(sid, [event])
                else:
                    assert await alice.emit_batch_encoded(sid, [event]) == {"seqs": [4], "duplicates": [4]}
            await alice.get(sid)  # reconnected
        assert [e["seq"] for e in (await obs.get(sid))["events"]] == [1, 2, 3, 4], "each stored once"


async def test_each_reconnect_asks_for_a_fresh_token_and_a_refused_one_ends_the_client(daemon: Daemon,
                                                                                      namespace: str) -> None:
    tokens = [token("alice", namespace), token("alice", namespace, ttl=7200), "revoked"]
    async with Client(url(daemon.port), lambda: tokens.pop(0), backoff=FAST) as alice:
        sid = (await alice.create_session())["sessionId"]
        async with alice.subscribe(sid) as sub:
            cut(alice)
            assert (await alice.emit(sid, {"type": "modified", "id": "m1"}))["seq"] == 1
            assert (await sub.__anext__()).seq == 1 and len(tokens) == 1
            cut(alice)
            with pytest.raises(Unauthorized), anyio.fail_after(5):
                await sub.__anext__()
            with pytest.raises(ClientClosed):
                await alice.get(sid)
        assert tokens == [] and alice.reconnects == 1


async def test_checkpoint_and_kg_upsert_through_the_client(daemon: Daemon, namespace: str) -> None:
    async with client(daemon.port, "alice", namespace) as alice, \
            Client(url(daemon.port), token("kg", namespace, scope="kg:write")) as loader:
        with pytest.raises(Forbidden):
            await alice.kg_upsert(nodes=[{"id": "fn:a", "labels": ["CodebaseEntity"]}])
        counts = await loader.kg_upsert(nodes=[{"id": "fn:a", "labels": ["CodebaseEntity"]},
                                               {"id": "cl:1", "labels": ["SemanticCluster"]}],
                                        edges=[{"from": "fn:a", "to": "cl:1", "type": "MEMBER_OF_CLUSTER"}])
        assert counts == {"nodes": 2, "edges": 1}
        sid = (await alice.create_session(["fn:a"]))["sessionId"]
        async with alice.subscribe(sid) as sub, alice.watch() as announcements:
            await alice.emit(sid, {"type": "broke", "changeInfo": {"entityIds": ["fn:a"]}})
            done = await alice.checkpoint(sid, final=True)
            assert done["outcome"] == "broken" and done["brokeDuring"] is True and done["entityIds"] == ["fn:a"]
            assert (await sub.__anext__()).type == "broke"
            with anyio.fail_after(5):
                note = await announcements.__anext__()
            assert (note["type"], note["sessionId"]) == ("completed", sid)
            assert sub.last_checkpoint is not None and sub.last_checkpoint["checkpointId"] == done["checkpointId"]
        with pytest.raises(Conflict):
            await alice.emit(sid, {"type": "modified"})


async def test_close_is_safe_twice_and_ends_subscriptions(daemon: Daemon, namespace: str) -> None:
    c = Client(url(daemon.port), token("alice", namespace))
    await c.__aenter__()
    sid = (await c.create_session())["sessionId"]
    sub = c.subscribe(sid)
    await sub.start()
    seen: list[int] = []

    async def consume() -> None:
        seen.extend([event.seq async for event in sub])

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.sleep(0.05)
        await c.aclose()
        await c.aclose()
    assert seen == []
    with pytest.raises(ClientClosed):
        await c.get(sid)


async def test_with_reconnect_off_a_cut_ends_everything_with_connection_lost(daemon: Daemon,
                                                                             namespace: str) -> None:
    async with client(daemon.port, "alice", namespace, reconnect=False) as alice:
        sid = (await alice.create_session())["sessionId"]
        async with alice.subscribe(sid) as sub:
            cut(alice)
            with pytest.raises(ConnectionLost), anyio.fail_after(5):
                await sub.__anext__()
        with pytest.raises(ConnectionLost):
            await alice.get(sid)


async def test_subscribe_replays_then_delivers_live_and_remembers_seq_and_epoch(daemon: Daemon,
                                                                                namespace: str) -> None:
    async with client(daemon.port, "a", namespace) as a, client(daemon.port, "b", namespace) as b:
        sid = (await a.create_session(["fn:x"]))["sessionId"]
        await emit_stream(a, sid, 20)
        epoch = (await a.get(sid, limit=1))["session"]["epoch"]
        with pytest.raises(NotFound):
            async with b.subscribe("no-such-session"):
                pass
        async with b.subscribe(sid, since=5) as replay, a.subscribe(sid) as live:
            assert replay.epoch == live.epoch == epoch and live.last_seq == 21
            await a.emit(sid, {"type": "broke"})
            first = await replay.__anext__()
            assert (first.session_id, first.seq, first.type, first.event["id"]) == (sid, 6, "modified", "e4")
            assert [first.seq, *await take(replay, 22)] == list(range(6, 23))
            assert await take(live, 22) == [22], "without since: only what comes after subscribing"
            assert replay.last_seq == 22 and replay.resyncs == 0
            with pytest.raises(ValueError, match="already subscribed"):
                await b.subscribe(sid).start()


async def test_a_subscriber_cut_every_200_events_ends_with_each_seq_once(daemon: Daemon, namespace: str) -> None:
    total = 2000
    async with client(daemon.port, "w", namespace) as writer, client(daemon.port, "s", namespace) as reader:
        sid = (await writer.create_session())["sessionId"]
        seqs: list[int] = []
        async with reader.subscribe(sid, since=0) as sub, anyio.create_task_group() as tg:
            tg.start_soon(emit_stream, writer, sid, total)
            with anyio.fail_after(60):
                async for event in sub:
                    seqs.append(event.seq)
                    if event.seq % 200 == 0 and event.seq < total:
                        await anyio.sleep(0.01)  # let the writer run on while we are away
                        while reader.connection is None:
                            await anyio.sleep(0.005)
                        cut(reader)
                    if event.seq == total:
                        break
        assert seqs == list(range(1, total + 1))
        assert reader.reconnects == 9 and reader.last_close_code == 1006 and sub.resyncs == 0


async def test_a_subscriber_closed_as_slow_consumer_resumes_with_no_loss(backend_urls: Endpoints, tmp_path: Path,
                                                                         namespace: str) -> None:
    closes = sample("memento_ws_slow_consumer_closes_total")
    settings = make_settings(backend_urls, tmp_path, ws_send_buffer=64 * 1024)
    blob = "x" * 15000
    async with running(settings) as daemon, client(daemon.port, "w", namespace) as writer, \
            client(daemon.port, "lazy", namespace) as lazy:
        sid = (await writer.create_session())["sessionId"]
        async with lazy.subscribe(sid, since=0) as sub:
            assert lazy.connection is not None
            lazy.connection.transport.pause_reading()  # a consumer that stops reading its socket
            for _ in range(40):
                await writer.emit_batch(sid, [{"type": "modified", "data": {"b": blob}}] * 20)
            with anyio.fail_after(10):
                while sample("memento_ws_slow_consumer_closes_total") == closes:
                    await anyio.sleep(0.01)
            lazy.connection.transport.resume_reading()
            await writer.emit(sid, {"type": "test_pass"})
            assert await take(sub, 801) == list(range(1, 802))
        assert lazy.last_close_code == 4008 and lazy.reconnects == 1
    assert sample("memento_ws_slow_consumer_closes_total") == closes + 1


async def test_a_consumer_slower_than_the_stream_gets_every_event_within_max_queue(daemon: Daemon,
                                                                                  namespace: str) -> None:
    async with client(daemon.port, "w", namespace) as writer, \
            client(daemon.port, "s", namespace, max_queue=25) as reader:
        sid = (await writer.create_session())["sessionId"]
        await emit_stream(writer, sid, 300, batch=100, pause=0)
        seqs: list[int] = []
        async with reader.subscribe(sid, since=0) as sub:
            with anyio.fail_after(30):
                async for event in sub:
                    assert sub.queued < 25
                    seqs.append(event.seq)
                    await anyio.sleep(0.001)
                    if event.seq == 300:
                        break
        assert seqs == list(range(1, 301)) and sub.resyncs >= 1 and reader.reconnects == 0


async def until(sub: Subscription, link: Link) -> None:
    """Wait until the client's reader has moved the subscription to `link`."""
    with anyio.fail_after(10):
        while sub.link is not link:
            await anyio.sleep(0.01)


async def test_a_subscriptions_phase_and_link_follow_its_life(daemon: Daemon, namespace: str) -> None:
    async with client(daemon.port, "w", namespace) as writer, \
            client(daemon.port, "s", namespace, max_queue=10) as reader:
        sid = (await writer.create_session())["sessionId"]
        sub = reader.subscribe(sid)
        assert (sub.phase, sub.link, sub.connection) == (Phase.NEW, Link.NONE, None)
        async with sub:
            first = reader.connection
            assert (sub.phase, sub.link) == (Phase.OPEN, Link.LIVE) and sub.connection is first
            cut(reader)
            await writer.emit(sid, {"type": "modified"})
            assert await take(sub, 1) == [1]
            assert sub.link is Link.LIVE and sub.connection is reader.connection and first is not reader.connection
            await emit_stream(writer, sid, 40, batch=40, pause=0)  # 30 more than the queue holds
            await until(sub, Link.STALE)  # the reader drops what comes once the queue is full
            assert await take(sub, 41) == list(range(2, 42))
            assert sub.link is Link.LIVE and sub.resyncs >= 1
        assert (sub.phase, sub.link, sub.connection) == (Phase.ENDED, Link.NONE, None)
        unused = reader.subscribe(sid)
        await unused.aclose()
        assert [event async for event in unused] == [] and unused.phase is Phase.ENDED
        async with reader.subscribe(sid) as again:  # the closed one never asked the server, nor holds the id
            assert again.link is Link.LIVE


async def serve(settings: Settings, stop: anyio.Event, stopped: anyio.Event, *,
                task_status: TaskStatus[Daemon]) -> None:
    """Run a daemon until `stop`; `stopped` is set once it let go of its port."""
    async with running(settings) as daemon:
        task_status.started(daemon)
        await stop.wait()
    stopped.set()


async def test_a_daemon_restart_closes_with_1001_and_the_subscriber_resumes(backend_urls: Endpoints,
                                                                           tmp_path: Path, namespace: str) -> None:
    port = free_port()
    first, second, first_gone = anyio.Event(), anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(serve, make_settings(backend_urls, tmp_path / "one", port=port), first, first_gone)
        async with client(port, "s", namespace) as reader:
            async with client(port, "w", namespace) as writer:
                sid = (await writer.create_session())["sessionId"]
                await emit_stream(writer, sid, 100)
            async with reader.subscribe(sid, since=0) as sub:
                assert await take(sub, 100) == list(range(1, 101))
                first.set()
                with anyio.fail_after(10):
                    await first_gone.wait()
                assert reader.connection is None and reader.last_close_code == 1001
                await tg.start(serve, make_settings(backend_urls, tmp_path / "two", port=port), second, anyio.Event())
                async with client(port, "w", namespace) as writer:
                    await emit_stream(writer, sid, 100, first=100)
                assert await take(sub, 200) == list(range(101, 201))
            assert reader.reconnects == 1
        second.set()


async def test_lost_history_raises_history_lost_then_goes_on_live(daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with client(daemon.port, "w", namespace) as writer, \
            client(daemon.port, "s", namespace, backoff=(1.0, 1.0)) as reader:
        sid = (await writer.create_session(session_id="lost-1"))["sessionId"]
        await emit_stream(writer, sid, 3, batch=3)
        async with reader.subscribe(sid, since=0) as sub:
            assert await take(sub, 3) == [1, 2, 3]
            old_epoch = sub.epoch
            cut(reader)  # while it is away, Redis loses the session and it is created again
            await r.delete(*keys.session_keys(namespace, sid).all())
            await writer.create_session(session_id=sid)
            await writer.emit_batch(sid, [{"type": "modified"}, {"type": "broke"}])
            with pytest.raises(HistoryLost) as lost, anyio.fail_after(10):
                await sub.__anext__()
            new_epoch = (await writer.get(sid, limit=1))["session"]["epoch"]
            assert (lost.value.last_seq, lost.value.seq, lost.value.epoch) == (3, 2, new_epoch)
            assert new_epoch != old_epoch and sub.epoch == new_epoch
            await writer.emit(sid, {"type": "test_pass"})
            event = await sub.__anext__()
            assert (event.seq, event.type) == (3, "test_pass"), "live again, in the new history"
        async with reader.subscribe(sid, since=7, epoch=new_epoch) as beyond:
            with pytest.raises(HistoryLost):
                await beyond.__anext__()
    await r.aclose()


async def test_watch_announces_sessions_and_survives_a_cut(daemon: Daemon, namespace: str) -> None:
    async with client(daemon.port, "w", namespace) as watcher, client(daemon.port, "a", namespace) as a:
        async with watcher.watch() as announcements:
            first = (await a.create_session(labels={"n": "1"}))["sessionId"]
            with anyio.fail_after(5):
                note = await announcements.__anext__()
            assert (note["type"], note["sessionId"], note["labels"]) == ("new", first, {"n": "1"})
            cut(watcher)
            await watcher.list_sessions()  # waits for the reconnect and the restored watch
            second = (await a.create_session())["sessionId"]
            with anyio.fail_after(5):
                assert (await announcements.__anext__())["sessionId"] == second
        assert watcher.reconnects == 1


async def test_a_session_created_anew_while_subscribed_raises_history_lost_then_goes_on(
        daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with client(daemon.port, "w", namespace) as writer, client(daemon.port, "r", namespace) as reader:
        sid = (await writer.create_session(session_id="reborn"))["sessionId"]
        async with reader.subscribe(sid) as sub:
            await writer.emit_batch(sid, [{"type": "modified"}] * 2)
            with anyio.fail_after(5):
                assert [(await sub.__anext__()).seq for _ in range(2)] == [1, 2]
            old_epoch = sub.epoch
            await r.delete(*keys.session_keys(namespace, sid).all())
            await writer.create_session(session_id=sid)
            await writer.emit(sid, {"type": "broke"})
            with pytest.raises(HistoryLost) as lost, anyio.fail_after(5):
                await sub.__anext__()
            assert (lost.value.last_seq, lost.value.seq) == (2, 1) and lost.value.epoch != old_epoch
            with anyio.fail_after(5):
                event = await sub.__anext__()
            assert (event.seq, event.event["type"]) == (1, "broke") and sub.epoch == lost.value.epoch
    await r.aclose()


async def test_iter_events_follows_next_since_and_gives_every_event_once_in_order(daemon: Daemon,
                                                                                  namespace: str) -> None:
    async with client(daemon.port, "pager", namespace) as c:
        sid = (await c.create_session())["sessionId"]
        for start in range(0, 2500, 500):
            await c.emit_batch(sid, [{"type": "modified", "data": {"n": n}} for n in range(start, start + 500)])
        first = await c.get(sid)
        assert len(first["events"]) == 1000 and first["nextSince"] == 1000, "one page, and where the next starts"
        last = await c.get(sid, since=2000)
        assert len(last["events"]) == 500 and "nextSince" not in last
        events = [event async for event in c.iter_events(sid)]
        assert [event["seq"] for event in events] == list(range(1, 2501))
        assert [event["data"]["n"] for event in events] == list(range(2500))
        assert [event["seq"] async for event in c.iter_events(sid, since=2400, limit=30)] == list(range(2401, 2501))


async def test_iter_sessions_follows_next_cursor_and_gives_every_session_once(daemon: Daemon, namespace: str) -> None:
    async with client(daemon.port, "lister", namespace) as c:
        made = []
        for _ in range(7):
            made.append((await c.create_session())["sessionId"])
            await anyio.sleep(0.002)  # distinct creation times, so newest first is `made` reversed
        page = await c.list_sessions_page(limit=3)
        assert [s["sessionId"] for s in page["sessions"]] == made[::-1][:3] and page["nextCursor"]
        second = await c.list_sessions(limit=3, cursor=page["nextCursor"])
        assert [s["sessionId"] for s in second] == made[::-1][3:6]
        assert [s["sessionId"] async for s in c.iter_sessions(limit=3)] == made[::-1]
        assert [s["sessionId"] async for s in c.iter_sessions(state="broken", limit=2)] == []
        assert [s["sessionId"] for s in await c.list_sessions()] == made[::-1], "one page, as before"


async def test_isolate_pages_and_iter_isolated_gives_each_of_the_agents_events(daemon: Daemon,
                                                                               namespace: str) -> None:
    async with client(daemon.port, "solo", namespace) as solo, client(daemon.port, "other", namespace) as other:
        sid = (await solo.create_session(["fn:s"]))["sessionId"]
        await other.join(sid)
        for n in range(5):
            await solo.emit(sid, {"type": "modified", "impact": {"perfDelta": 1.0}})
            await other.emit(sid, {"type": "modified", "data": {"n": n}})
        page = await solo.isolate(sid, "solo", limit=4)
        assert [e["seq"] for e in page["events"]] == [1, 2, 4, 6] and page["nextSince"] == 6
        assert page["totalPerfDelta"] == 5.0
        assert [e["seq"] async for e in solo.iter_isolated(sid, "solo", limit=2)] == [1, 2, 4, 6, 8, 10]
