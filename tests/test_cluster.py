# mypy: disable-error-code="no-untyped-call"
"""A Redis Cluster of three primaries under the daemon: slots, sharded pub/sub across daemons, a restarted
primary, MOVED/ASK during a slot migration, and URL errors found before anything starts.

Runs on the session's cluster in the cluster run (MEMENTO_TEST_TOPOLOGY=cluster), else on one of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from structlog.testing import capture_logs

from memento_sessions import keys
from memento_sessions.endpoints import Endpoints
from memento_sessions.errors import ConfigError
from memento_sessions.redisio.fanout import Fanout
from memento_sessions.server.daemon import running
from memento_sessions.settings import load_settings
from tests.cluster import PASSWORD, LocalCluster
from tests.helpers import make_settings, token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = pytest.mark.anyio


def on_cluster(urls: Endpoints, cluster: LocalCluster) -> Endpoints:
    return Endpoints(cluster.url, urls.postgres_dsn)


async def seqs_until(peer: RpcSocket, last: int, timeout: float = 30) -> list[int]:
    """Seqs of session.event notifications in arrival order until `last` arrived."""
    seqs: list[int] = []
    with anyio.fail_after(timeout):
        while not seqs or seqs[-1] < last:
            seqs.append((await peer.notification("session.event", timeout))["params"]["seq"])
    return seqs


def node(cluster: LocalCluster, port: int) -> aioredis.Redis:
    return aioredis.Redis(port=port, password=PASSWORD, decode_responses=True)


async def test_a_sessions_keys_and_channel_live_in_one_slot_on_one_primary(
        cluster: LocalCluster, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = make_settings(on_cluster(backend_urls, cluster), tmp_path)
    async with running(settings) as daemon, rpc(daemon.port, token("a", namespace)) as peer:
        sid = (await peer.call("session.create", {"entityIds": ["e1"]}))["sessionId"]
        await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "x1"}})
    skeys = keys.session_keys(namespace, sid)
    names = [*skeys.all(), keys.session_channel(namespace, sid), keys.checkpoint_lock(namespace, sid),
             keys.pending_snapshots(namespace, sid)]
    assert len({key_slot(name.encode()) for name in names}) == 1
    holder = node(cluster, cluster.port_of(skeys.session))
    try:
        slots = {await holder.execute_command("CLUSTER", "KEYSLOT", name) for name in names}
        assert slots == {key_slot(skeys.session.encode())}
        assert await holder.exists(*skeys.all()) == 4  # session, events, agents, ids: all on that primary
    finally:
        await holder.aclose()


async def test_the_function_library_is_on_every_primary_and_reloaded_where_lost(
        cluster: LocalCluster, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = make_settings(on_cluster(backend_urls, cluster), tmp_path)
    async with running(settings) as daemon, rpc(daemon.port, token("a", namespace)) as peer:
        for port in cluster.ports:
            primary = node(cluster, port)
            libraries = await primary.function_list(library="memento_v1", withcode=True)
            fields = dict(zip(libraries[0][::2], libraries[0][1::2], strict=True))  # RESP2: a flat list
            code = fields["library_code"]
            assert "local SESSION_PUBLISH = 'SPUBLISH'" in code, port
            await primary.aclose()
        sid = (await peer.call("session.create", {}))["sessionId"]
        holder = node(cluster, cluster.port_of(keys.session_keys(namespace, sid).session))
        await holder.function_flush()  # a primary that came back empty
        await holder.aclose()
        emitted = await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}})
        assert emitted["seq"] == 1


async def test_subscribers_on_daemon_b_get_every_event_emitted_through_a_while_a_shard_connection_is_killed(
        cluster: LocalCluster, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    urls = on_cluster(backend_urls, cluster)
    total = 400
    async with running(make_settings(urls, tmp_path / "a")) as a, running(make_settings(urls, tmp_path / "b")) as b, \
            rpc(a.port, token("w", namespace)) as writer, rpc(b.port, token("r", namespace)) as reader:
        sid = (await writer.call("session.create", {}))["sessionId"]
        assert (await reader.call("session.subscribe", {"sessionId": sid}))["seq"] == 0
        holder = node(cluster, cluster.port_of(keys.session_keys(namespace, sid).session))
        assert b.services is not None and b.services.fanout.shards is not None
        channel_port = cluster.port_of(keys.session_channel(namespace, sid))
        assert list(b.services.fanout.shards.conns) == [f"127.0.0.1:{channel_port}"]

        async def emit_all() -> None:
            for i in range(total):
                await writer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": f"e{i}"}})
                if i in (100, 250):
                    killed = await holder.client_kill_filter(_type="pubsub")
                    assert killed >= 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(emit_all)
            seqs = await seqs_until(reader, total)
        await holder.aclose()
    assert seqs == list(range(1, total + 1))
    assert b.services.fanout.shards.conns == {}  # dropped with the last listener


async def test_every_subscriber_gets_every_event_after_the_pub_sub_connections_of_every_primary_are_killed(
        cluster: LocalCluster, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    # Many sessions on every primary, their channels in many slots: a lost shard connection is subscribed anew
    # one SSUBSCRIBE per slot (one across slots is refused with CROSSSLOT), after a pause, not in a hot loop.
    count, rounds = 36, 6
    settings = make_settings(on_cluster(backend_urls, cluster), tmp_path)
    with capture_logs() as logs:
        async with running(settings) as daemon, rpc(daemon.port, token("w", namespace)) as writer, \
                rpc(daemon.port, token("r", namespace)) as reader:
            sids = [(await writer.call("session.create", {}))["sessionId"] for _ in range(count)]
            slots: dict[int, set[int]] = {port: set() for port in cluster.ports}
            for sid in sids:
                channel = keys.session_channel(namespace, sid)
                slots[cluster.port_of(channel)].add(key_slot(channel.encode()))
            assert all(len(on_primary) >= 3 for on_primary in slots.values()), slots
            for sid in sids:
                assert (await reader.call("session.subscribe", {"sessionId": sid}))["seq"] == 0
            for round_ in range(rounds):
                if round_ == 1:
                    for port in cluster.ports:
                        primary = node(cluster, port)
                        assert await primary.client_kill_filter(_type="pubsub") >= 1  # the daemon's, at least
                        await primary.aclose()
                for sid in sids:
                    await writer.call("event.emit", {"sessionId": sid, "event": {"type": "modified",
                                                                               "id": f"r{round_}"}})
                await anyio.sleep(0.5)
            received = await events_until(reader, {sid: rounds for sid in sids}, timeout=30)
    assert received == {sid: list(range(1, rounds + 1)) for sid in sids}
    warnings = [entry for entry in logs if entry["log_level"] in ("warning", "error")]
    lost = [entry for entry in warnings if entry["event"] == "sharded pub/sub connection lost; resubscribing"]
    assert 1 <= len(lost) <= 2 * len(cluster.ports), lost
    assert len(warnings) <= 6 * len(cluster.ports), [entry["event"] for entry in warnings][:20]
    assert not [entry for entry in logs if "exc_info" in entry]


async def events_until(peer: RpcSocket, last: dict[str, int], timeout: float) -> dict[str, list[int]]:
    """Seqs of session.event notifications per session, in arrival order, until each session's `last` arrived;
    on timeout, what arrived (the assertion then shows which sessions stopped)."""
    received: dict[str, list[int]] = {sid: [] for sid in last}
    with anyio.move_on_after(timeout):
        while any(not seqs or seqs[-1] < last[sid] for sid, seqs in received.items()):
            params = (await peer.notification("session.event", timeout))["params"]
            received[params["sessionId"]].append(params["seq"])
    return received


class Counter:
    """A fan-out listener that counts its messages and catch-ups."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.catch_ups = 0

    def on_message(self, data: str) -> None:
        self.messages.append(data)

    def on_reconnect(self) -> None:
        self.catch_ups += 1


async def test_a_channel_left_and_joined_again_at_once_is_not_taken_for_a_moved_slot(
        cluster: LocalCluster, namespace: str) -> None:
    # The last listener leaves (SUNSUBSCRIBE sent) and a new one comes before Redis answered: the reply to our own
    # SUNSUBSCRIBE is not a slot that moved, so nothing is resubscribed and nobody is told to catch up; and once
    # every listener left, no channel stays subscribed and no confirmation is kept. A channel of the same slot
    # keeps each shard's connection open throughout.
    fanout = Fanout(cluster.url, f"{namespace}:control")
    channels = [keys.session_channel(namespace, f"s{i}") for i in range(6)]
    keepers = [(keys.session_channel(namespace, same_slot_id(f"s{i}")), Counter()) for i in range(6)]
    publishers = {channel: node(cluster, cluster.port_of(channel)) for channel in channels}
    listeners: list[Counter] = []
    async with anyio.create_task_group() as tg:
        await tg.start(fanout.run)
        for keeper in keepers:
            await fanout.attach(*keeper)
        for round_ in range(15):
            for channel in channels:
                first, second = Counter(), Counter()
                await fanout.attach(channel, first)
                fanout.detach(channel, first)
                await fanout.attach(channel, second)
                listeners.append(second)
                await publishers[channel].execute_command("SPUBLISH", channel, f"r{round_}")
                with anyio.fail_after(5):
                    while not second.messages:
                        await anyio.sleep(0.001)
                await anyio.sleep(0.02)  # time for a mistaken resubscription to tell `second` to catch up
                fanout.detach(channel, second)
        for keeper in keepers:
            fanout.detach(*keeper)
        await anyio.sleep(0.5)  # every reply is in
        assert fanout.shards is not None
        assert (fanout.shards.home, fanout.shards.conns, fanout._confirmed) == ({}, {}, {})
        assert fanout.shards.losses == 0
        tg.cancel_scope.cancel()
    await fanout.aclose()
    for publisher in publishers.values():
        await publisher.aclose()
    assert [listener.catch_ups for listener in listeners] == [0] * len(listeners)
    assert all(len(listener.messages) == 1 for listener in listeners)


async def test_a_primary_restarted_mid_stream_loses_nothing_acknowledged(
        cluster: LocalCluster, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = make_settings(on_cluster(backend_urls, cluster), tmp_path)
    acked: dict[str, int] = {}
    async with running(settings) as daemon, rpc(daemon.port, token("w", namespace)) as writer, \
            rpc(daemon.port, token("r", namespace)) as reader:
        sid = (await writer.call("session.create", {}))["sessionId"]
        await reader.call("session.subscribe", {"sessionId": sid})
        port = cluster.port_of(keys.session_keys(namespace, sid).session)

        async def emit(i: int) -> None:
            while True:  # an unanswered emit may have run: retried with the same id, it is stored once
                reply = await writer.request("event.emit", {"sessionId": sid, "event": {"type": "modified",
                                                                                         "id": f"e{i}"}})
                if "result" in reply:
                    acked[f"e{i}"] = reply["result"]["seq"]
                    return
                assert reply["error"]["code"] == -32050, reply
                await anyio.sleep(0.05)

        for i in range(300):
            if i == 150:
                await anyio.to_thread.run_sync(cluster.restart, port)
            await emit(i)
        seqs = await seqs_until(reader, 300)
        stored = (await writer.call("session.get", {"sessionId": sid}))["events"]
    assert seqs == list(range(1, 301))
    assert {event["id"]: event["seq"] for event in stored} == acked
    assert sorted(acked.values()) == list(range(1, 301))


def same_slot_id(sid: str) -> str:
    """Another session id whose keys hash to the slot of `sid`'s."""
    slot = key_slot(sid.encode())
    return next(f"twin-{i}" for i in range(10**6) if key_slot(f"twin-{i}".encode()) == slot)


@dataclass
class Moving:
    """A daemon on the cluster, a session of one event (`m1`) in it, its slot, and a primary to move it to."""

    peer: RpcSocket
    sid: str
    skeys: keys.SessionKeys
    slot: int
    source: int
    target: int


@asynccontextmanager
async def a_session_to_move(cluster: LocalCluster, backend_urls: Endpoints, tmp_path: Path,
                            namespace: str) -> AsyncIterator[Moving]:
    settings = make_settings(on_cluster(backend_urls, cluster), tmp_path)
    async with running(settings) as daemon, rpc(daemon.port, token("w", namespace)) as peer:
        sid = (await peer.call("session.create", {}))["sessionId"]
        await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "m1"}})
        skeys = keys.session_keys(namespace, sid)
        source = cluster.port_of(skeys.session)
        target = next(port for port in cluster.primaries() if port != source)
        yield Moving(peer, sid, skeys, key_slot(skeys.session.encode()), source, target)


async def test_a_slot_migrated_under_the_daemon_is_followed_through_ask_and_moved(
        cluster: LocalCluster, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with a_session_to_move(cluster, backend_urls, tmp_path, namespace) as moving:
        peer, sid, skeys, slot, source_port, target_port = (moving.peer, moving.sid, moving.skeys, moving.slot,
                                                             moving.source, moving.target)
        source, target = node(cluster, source_port), node(cluster, target_port)
        source_id = await source.execute_command("CLUSTER", "MYID")
        target_id = await target.execute_command("CLUSTER", "MYID")
        try:
            await target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            await source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            # Other tests' keys may share the slot (the session cluster is never flushed): all of them move.
            names = await source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10_000)
            assert set(skeys.all()) <= set(names)
            await source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "AUTH", PASSWORD,
                                         "KEYS", *names)
            # The source has none of the session's keys now: it answers ASK, and the target serves it after ASKING.
            assert (await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "m2"}}))[
                "seq"] == 2
            # A new session in a slot mid-migration cannot be made on either side (TRYAGAIN): unavailable, retried.
            twin = same_slot_id(sid)
            assert (await peer.error("session.create", {"sessionId": twin}))["code"] == -32050
            for port in cluster.ports:
                primary = node(cluster, port)
                await primary.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
                await primary.aclose()
            # The slot is the target's now: the source answers MOVED and the daemon re-reads the topology.
            assert (await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "m3"}}))[
                "seq"] == 3
            assert (await peer.call("session.create", {"sessionId": twin}))["seq"] == 0  # the refused one wrote nothing
            assert await target.zcard(skeys.events) == 3
            assert [e["id"] for e in (await peer.call("session.get", {"sessionId": sid}))["events"]] == [
                "m1", "m2", "m3"]
        finally:
            await source.aclose()
            await target.aclose()


async def test_a_read_while_two_primaries_send_each_other_its_slot_is_refused_as_unavailable(
        cluster: LocalCluster, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    # Mid-reshard (or mid-failover) the topology is in flux: here the source has given the slot away while the
    # target still names the source, so each answers MOVED to the other. redis-py's cluster transactions (every
    # session read) gave up with the MovedError itself, which was answered -32603 and made a subscription's
    # catch-up go live without its replay; it is the backend not answering (-32050, retried).
    async with a_session_to_move(cluster, backend_urls, tmp_path, namespace) as moving:
        peer, sid, slot, source, target = moving.peer, moving.sid, moving.slot, moving.source, moving.target
        cluster.move_keys(slot, source, target, batch=100, pause=0)
        cluster.assign(slot, target, [source])  # the target not told yet
        try:
            error = await peer.error("session.get", {"sessionId": sid})
            assert error["code"] == -32050, error
            assert (await peer.error("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "m2"}}))[
                "code"] == -32050
        finally:
            cluster.assign(slot, target)
        # Settled: the read and the write go through, and the refused emit wrote nothing.
        assert [e["id"] for e in (await peer.call("session.get", {"sessionId": sid}))["events"]] == ["m1"]
        assert (await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "m2"}}))[
            "seq"] == 2


@pytest.mark.parametrize(("url", "message"), [
    ("redis+cluster://", "is not host:port"),
    ("redis+cluster://a:1,b", "'b' is not host:port"),
    ("redis+cluster://a:99999", "the port must be 1-65535"),
    ("redis+cluster://a:1/3", "only database 0"),
])
def test_a_bad_cluster_url_is_refused_when_settings_are_read(url: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(redis_url=url, falkordb_url="redis://f:1", data_dir=tmp_path)
    assert str(refused.value).startswith("invalid MEMENTO_REDIS_URL: ") and message in str(refused.value)


def test_a_cluster_without_a_falkordb_url_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMENTO_FALKORDB_URL", raising=False)  # the cluster run sets it for daemon processes
    with pytest.raises(ConfigError) as refused:
        load_settings(redis_url="redis+cluster://a:1", data_dir=tmp_path)
    assert str(refused.value).startswith("invalid MEMENTO_FALKORDB_URL: ")


def test_serve_with_a_bad_cluster_url_exits_before_starting_any_server(tmp_path: Path) -> None:
    env = {**os.environ, "MEMENTO_REDIS_URL": "redis+cluster://h:1,nope", "MEMENTO_DATA_DIR": str(tmp_path),
           "MEMENTO_FALKORDB_URL": "redis://127.0.0.1:1", "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("MEMENTO_POSTGRES_DSN", None)  # unset: an embedded Postgres would be started first
    done = subprocess.run([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0
    assert "invalid MEMENTO_REDIS_URL: 'nope' is not host:port" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no embedded Postgres (nor anything else) was started


def test_cluster_url_nodes_and_credentials() -> None:
    from memento_sessions.settings import ClusterUrl
    parsed = ClusterUrl.parse("redis+cluster://u:p%40ss@10.0.0.1:7000,[::1]:7001,redis-0.redis:6379/0")
    assert parsed == ClusterUrl((("10.0.0.1", 7000), ("::1", 7001), ("redis-0.redis", 6379)), "u", "p@ss")
    assert parsed.node_url("10.0.0.1", 7000) == "redis://u:p%40ss@10.0.0.1:7000/0"
    assert json.dumps(parsed.nodes)  # plain tuples
    _: Any = None
