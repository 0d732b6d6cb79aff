# mypy: disable-error-code="no-untyped-call"
"""MEMENTO_REPLICA_ACKS on a standalone Redis with one replica (tests/cluster.py's ReplicatedRedis): an emit is
answered once the replica holds it, one WAIT covers the writes of a loop turn, and a replica that does not
answer makes the emit -32050 (replica_ack_timeout) within the timeout, retried safely by its id. The servers are
the module's own, so it runs once (in the single-Redis run)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path

import anyio
import pytest

from memento_sessions import keys
from memento_sessions.endpoints import Endpoints
from memento_sessions.errors import BackendUnavailable
from memento_sessions.redisio.pipe import Acks, Pipe
from memento_sessions.server.daemon import running
from memento_sessions.settings import Settings
from tests.cluster import ReplicatedRedis
from tests.helpers import falkordb_url, make_settings, token
from tests.rpcsocket import rpc

pytestmark = [pytest.mark.anyio, pytest.mark.topology_independent]  # its own servers: run once


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedRedis]:
    servers = ReplicatedRedis(tmp_path_factory.mktemp("replicated"))
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()


def acked_settings(pair: ReplicatedRedis, urls: Endpoints, data_dir: Path, timeout_ms: int) -> Settings:
    """A daemon on the pair's primary (the graphs on the session's FalkorDB) that waits for one replica."""
    return make_settings(Endpoints(pair.url, urls.postgres_dsn), data_dir,
                         falkordb_url=falkordb_url(urls) or urls.redis_url,
                         replica_acks=1, replica_ack_timeout_ms=timeout_ms)


def stopped(pair: ReplicatedRedis, stop: bool) -> None:
    """SIGSTOP (or SIGCONT) the replica: its link stays up, it acknowledges nothing meanwhile."""
    pair.procs[pair.replica].send_signal(signal.SIGSTOP if stop else signal.SIGCONT)


async def test_one_wait_covers_every_call_of_a_loop_turn(pair: ReplicatedRedis, namespace: str) -> None:
    pipe, admin = Pipe(pair.url), pair.client(pair.primary)
    acks = Acks(1, 2000)
    try:
        assert await pipe.call_acked(acks, "INCR", f"{namespace}:warm") == 1  # connected: no await before sends
        waits = admin.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
        replies = await asyncio.gather(*(pipe.call_acked(acks, "INCR", f"{namespace}:n") for _ in range(200)))
        assert replies == list(range(1, 201))
        assert admin.info("commandstats")["cmdstat_wait"]["calls"] - waits == 1
        with pair.client(pair.replica) as replica:
            assert replica.get(f"{namespace}:n") == "200"  # the replica had every write when the replies came
    finally:
        pipe.close()
        admin.close()


async def test_a_call_the_replica_does_not_acknowledge_is_unavailable(pair: ReplicatedRedis,
                                                                          namespace: str) -> None:
    pipe = Pipe(pair.url)
    stopped(pair, True)
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable) as behind:
            await pipe.call_acked(Acks(1, 300), "SET", f"{namespace}:k", "v")
        assert 0.25 < time.monotonic() - started < 3.0
        assert behind.value.code == -32050 and behind.value.data["reason"] == "replica_ack_timeout"
        assert await pipe.call("GET", f"{namespace}:k") == "v"  # written on the primary, not acknowledged
    finally:
        stopped(pair, False)
        pipe.close()


async def test_calls_without_acks_do_not_queue_behind_a_wait(pair: ReplicatedRedis, namespace: str) -> None:
    # A WAIT holds its connection until the replicas answer: up to its timeout when one is away. Other calls
    # (joins, leases, creates) go out on the pipe's other connection, answered meanwhile.
    pipe = Pipe(pair.url)
    await pipe.call("PING")
    stopped(pair, True)
    try:
        async with anyio.create_task_group() as tg:
            waiting = time.monotonic()
            tg.start_soon(lambda: expect_behind(pipe.call_acked(Acks(1, 1500), "SET", f"{namespace}:a", "1")))
            await anyio.sleep(0.1)
            started = time.monotonic()
            assert await pipe.call("INCR", f"{namespace}:other") == 1
            assert time.monotonic() - started < 0.5
        assert time.monotonic() - waiting > 1.4
    finally:
        stopped(pair, False)
        pipe.close()


async def expect_behind(call: Awaitable[object]) -> None:
    with pytest.raises(BackendUnavailable):
        await call


async def test_an_emit_is_answered_only_once_the_replica_holds_it(
        pair: ReplicatedRedis, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = acked_settings(pair, backend_urls, tmp_path, timeout_ms=4000)
    async with running(settings) as daemon, rpc(daemon.port, token("w", namespace)) as writer:
        sid = (await writer.call("session.create", {}))["sessionId"]
        events_key = keys.session_keys(namespace, sid).events
        replica = pair.client(pair.replica)
        for i in range(20):
            assert (await writer.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}}))["seq"] == i + 1
            assert replica.zcard(events_key) == i + 1
        batch = [{"type": "modified", "id": f"b{i}"} for i in range(5)]
        seqs = (await writer.call("event.emitBatch", {"sessionId": sid, "events": batch}))["seqs"]
        assert seqs == [21, 22, 23, 24, 25]
        assert replica.zcard(events_key) == 25
        stopped(pair, True)
        try:
            reply: dict[str, object] = {}
            async with anyio.create_task_group() as tg:
                async def emit() -> None:
                    reply.update(await writer.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}}))
                tg.start_soon(emit)
                await anyio.sleep(0.5)
                assert reply == {}, "answered while the replica could not have acknowledged it"
                stopped(pair, False)
        finally:
            stopped(pair, False)
        assert reply["seq"] == 26 and replica.zcard(events_key) == 26
        replica.close()


async def test_an_emit_past_the_timeout_is_32050_and_its_retry_by_id_stores_it_once(
        pair: ReplicatedRedis, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = acked_settings(pair, backend_urls, tmp_path, timeout_ms=300)
    async with running(settings) as daemon, rpc(daemon.port, token("w", namespace)) as writer:
        sid = (await writer.call("session.create", {}))["sessionId"]
        stopped(pair, True)
        try:
            started = time.monotonic()
            error = await writer.error("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "x"}})
            assert time.monotonic() - started < 3.0
            batch = [{"type": "modified", "id": "y"}, {"type": "modified", "id": "z"}]
            batch_error = await writer.error("event.emitBatch", {"sessionId": sid, "events": batch})
        finally:
            stopped(pair, False)
        for refused in (error, batch_error):
            assert refused["code"] == -32050
            assert refused["data"] == {"backend": "redis", "reason": "replica_ack_timeout"}
        retried = await writer.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "id": "x"}})
        assert retried == {"seq": 1, "duplicate": True}  # stored by the refused emit, acknowledged now
        again = await writer.call("event.emitBatch", {"sessionId": sid, "events": batch})
        assert again["seqs"] == [2, 3]
        events = (await writer.call("session.get", {"sessionId": sid}))["events"]
        assert [event["id"] for event in events] == ["x", "y", "z"]
        with pair.client(pair.replica) as replica:
            assert replica.zcard(keys.session_keys(namespace, sid).events) == 3


def test_replica_ack_settings_are_bounded(tmp_path: Path) -> None:
    from memento_sessions.errors import ConfigError
    from memento_sessions.settings import load_settings
    for bad in ({"replica_acks": -1}, {"replica_ack_timeout_ms": 0}, {"replica_ack_timeout_ms": 5000}):
        with pytest.raises(ConfigError):
            load_settings(data_dir=tmp_path, **bad)


async def test_lease_grants_and_mailbox_sends_wait_for_the_replica_too(
        pair: ReplicatedRedis, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    # A grant a failover loses would be granted again to another agent, with a fencing token already handed out:
    # with MEMENTO_REPLICA_ACKS=1 a grant, a renewal, a release and a send are answered once the replica has them.
    acquire = {"entityIds": ["e1"], "ttl": 60, "mode": "exclusive"}
    leases = keys.lease_keys(namespace).leases
    async with running(acked_settings(pair, backend_urls, tmp_path / "acked", timeout_ms=300)) as daemon, \
            rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)):
        held = await a.call("lease.acquire", {**acquire, "entityIds": ["e0"]})
        with pair.client(pair.replica) as replica:
            assert held["granted"] is True and replica.hexists(leases, held["leaseId"])  # there when answered
        stopped(pair, True)
        try:
            started = time.monotonic()
            refused = [await a.error("lease.acquire", acquire),
                       await a.error("lease.renew", {"leaseId": held["leaseId"], "ttl": 60}),
                       await a.error("mailbox.send", {"to": "b", "body": {"n": 1}, "id": "m1"}),
                       await a.error("lease.release", {"leaseId": held["leaseId"]})]
            took = time.monotonic() - started
        finally:
            stopped(pair, False)
        assert [(error["code"], error["data"]) for error in refused] == [
            (-32050, {"backend": "redis", "reason": "replica_ack_timeout"})] * 4
        assert 4 * 0.25 < took < 4 * 3.0
    unwaited = make_settings(Endpoints(pair.url, backend_urls.postgres_dsn), tmp_path / "plain",
                             falkordb_url=falkordb_url(backend_urls) or backend_urls.redis_url, replica_acks=0)
    async with running(unwaited) as daemon, rpc(daemon.port, token("c", namespace)) as c:
        stopped(pair, True)
        try:
            started = time.monotonic()
            granted = await c.call("lease.acquire", {**acquire, "entityIds": ["e2"]})
            took = time.monotonic() - started
        finally:
            stopped(pair, False)
        assert granted["granted"] is True and took < 1.0  # not waited on: answered with the replica away
