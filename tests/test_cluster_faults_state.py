# mypy: disable-error-code="no-untyped-call"
"""A session's state other than its events through the faults of a Redis Cluster with replicas (3 primaries, a
replica each, 1 s node timeout, MEMENTO_REPLICA_ACKS=1, the replicas keeping up): presence, snapshots (time
travel with `atSeq`), compaction and suspend/resume, through a primary SIGKILLed (its replica promoted) and through
a migration of a slot holding sessions, and then through a daemon SIGKILLed and restarted on that cluster.

On every primary, two sessions in one slot: one with a snapshot, a compaction and two agents present, one
suspended. The cluster is this module's own, so the module runs once (in the single-Redis run of the suite).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.crc import key_slot

from memento_sessions import keys
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import running
from tests.cluster import LocalCluster, free_port
from tests.helpers import make_settings, token
from tests.rpcsocket import RpcSocket, rpc
from tests.test_cli_session import DaemonProcess
from tests.test_cluster_faults import falkordb, on, replica_of, retried

pytestmark = [pytest.mark.anyio, pytest.mark.topology_independent]
PRESENCE_IDLE = 3.0  # the daemon's presence heartbeat is a third of it: 1 s
EMITTED, SNAPSHOT_AT, COMPACTED_TO, SUSPENDED_EVENTS = 20, 12, 6, 8


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("replicated-cluster-state"), replicas=1, node_timeout_ms=1000)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def pair_on(cluster: LocalCluster, prefix: str, primary: int) -> tuple[str, str]:
    """Two session ids whose slot is on `primary` (the same slot for both)."""
    first = next(sid for sid in (f"{prefix}-{i}" for i in range(10**6))
                 if cluster.port_of_slot(key_slot(sid.encode())) == primary)
    slot = key_slot(first.encode())
    second = next(sid for sid in (f"{prefix}-{i}-s" for i in range(10**6)) if key_slot(sid.encode()) == slot)
    return first, second


@dataclass
class Group:
    """The sessions of one primary: `live` (snapshot, compaction, agents present) and `asleep` (suspended), and
    what was read from them before the fault."""

    live: str
    asleep: str
    at_snapshot: dict[str, Any]  # session.get atSeq SNAPSHOT_AT
    after_compaction: dict[str, Any]  # session.get atSeq COMPACTED_TO + 2 (the compaction's snapshot + events)
    whole: dict[str, Any]  # session.get (events after the compaction, its snapshot)
    asleep_events: list[dict[str, Any]]


def same(view: dict[str, Any]) -> dict[str, Any]:
    """What a read must keep across the faults: all but the session's clock-driven fields."""
    session = {k: v for k, v in view["session"].items() if k not in ("updatedAt", "expiresAt", "lastActivity")}
    return {**view, "session": session}


async def prepare(peer: RpcSocket, others: list[RpcSocket], live: str, asleep: str) -> Group:
    await peer.call("session.create", {"sessionId": live})
    for other in others:
        await other.call("session.join", {"sessionId": live})
    await peer.call("event.emitBatch", {"sessionId": live, "events": [
        {"type": "modified", "id": f"e{i}", "changeInfo": {"entityIds": [f"fn:{i % 3}"]}} for i in range(SNAPSHOT_AT)]})
    assert (await peer.call("session.snapshot", {"sessionId": live}))["seq"] == SNAPSHOT_AT
    await peer.call("event.emitBatch", {"sessionId": live, "events": [
        {"type": "modified", "id": f"e{i}"} for i in range(SNAPSHOT_AT, EMITTED)]})
    await peer.call("session.checkpoint", {"sessionId": live})  # compaction keeps what no checkpoint has
    assert (await peer.call("session.compact", {"sessionId": live, "beforeSeq": COMPACTED_TO}))["compactedSeq"] == (
        COMPACTED_TO)
    await peer.call("session.create", {"sessionId": asleep})
    await peer.call("event.emitBatch", {"sessionId": asleep, "events": [
        {"type": "modified", "id": f"s{i}"} for i in range(SUSPENDED_EVENTS)]})
    asleep_events = (await peer.call("session.get", {"sessionId": asleep}))["events"]
    await peer.call("session.suspend", {"sessionId": asleep})
    return Group(live, asleep, await peer.call("session.get", {"sessionId": live, "atSeq": SNAPSHOT_AT}),
                 await peer.call("session.get", {"sessionId": live, "atSeq": COMPACTED_TO + 2}),
                 await peer.call("session.get", {"sessionId": live}), asleep_events)


async def check_reads(peer: RpcSocket, group: Group) -> None:
    """The snapshot's view, the compacted session and its time travel read as before the fault."""
    at = await retried(peer, "session.get", {"sessionId": group.live, "atSeq": SNAPSHOT_AT})
    assert same(at) == same(group.at_snapshot), group.live
    after = await retried(peer, "session.get", {"sessionId": group.live, "atSeq": COMPACTED_TO + 2})
    assert same(after) == same(group.after_compaction), group.live
    whole = await retried(peer, "session.get", {"sessionId": group.live})
    assert same(whole) == same(group.whole), group.live
    assert whole["session"]["compactedSeq"] == COMPACTED_TO and whole["snapshot"]["seq"] == COMPACTED_TO


async def present(peer: RpcSocket, sid: str) -> list[str]:
    return sorted(agent["agentId"] for agent in (await retried(peer, "presence.get", {"sessionId": sid}))["agents"])


async def check_presence(peer: RpcSocket, groups: list[Group], agents: list[str], report: dict[str, Any]) -> None:
    """Every live session lists its agents: at once (the replica had their fields), or within a few heartbeats
    (the daemon writes its fields again at each one); which it was goes in the report."""
    started = time.monotonic()
    report["presence_at_once"] = [await present(peer, g.live) == agents for g in groups].count(True)
    with anyio.fail_after(10):  # several heartbeats of 1 s, with slack for a loaded host
        while any([await present(peer, g.live) != agents for g in groups]):
            await anyio.sleep(0.1)
    report["presence_all_after_s"] = round(time.monotonic() - started, 2)


async def check_writes(peer: RpcSocket, group: Group, emitted: dict[str, int], tag: str) -> None:
    """New emits continue the seqs (none handed out twice); the suspended session resumes with all its events."""
    seq = (await retried(peer, "event.emit", {"sessionId": group.live, "event": {"type": "modified", "id": tag}}))
    emitted[group.live] += 1
    assert seq == {"seq": emitted[group.live], "duplicate": False}, (group.live, seq)
    resumed = await retried(peer, "session.resume", {"sessionId": group.asleep})
    assert (resumed["status"], resumed["seq"]) == ("active", group.asleep_events[-1]["seq"]), resumed
    got = await retried(peer, "session.get", {"sessionId": group.asleep})
    assert got["events"] == group.asleep_events, group.asleep
    seq = await retried(peer, "event.emit", {"sessionId": group.asleep, "event": {"type": "modified", "id": tag}})
    assert seq == {"seq": group.asleep_events[-1]["seq"] + 1, "duplicate": False}, (group.asleep, seq)
    await retried(peer, "session.suspend", {"sessionId": group.asleep})
    group.asleep_events = (await retried(peer, "session.get", {"sessionId": group.asleep}))["events"]


def kill_and_promote(cluster: LocalCluster, victim: int, report: dict[str, Any]) -> None:
    killed = time.monotonic()
    cluster.kill(victim)
    cluster.wait_promoted(victim)
    report["promoted_after_s"] = round(time.monotonic() - killed, 2)


def rejoin(cluster: LocalCluster, victim: int, report: dict[str, Any]) -> None:
    """Start the killed primary again: it comes back as the promoted one's replica."""
    started = time.monotonic()
    cluster.start_node(victim)
    cluster.wait_ok()
    report["replica_back_after_s"] = round(time.monotonic() - started, 2)


@pytest.mark.parametrize("fault", ["failover", "migration"])
async def test_presence_snapshots_compaction_and_suspend_survive_the_fault_and_a_daemon_sigkill(
        replicated: LocalCluster, backend_urls: Endpoints, tmp_path: Path, namespace: str, fault: str) -> None:
    urls = on(replicated, backend_urls)
    settings = {"falkordb_url": falkordb(backend_urls), "replica_acks": 1, "replica_ack_timeout_ms": 1000,
                "presence_idle": PRESENCE_IDLE, "log_level": "error"}
    served = DaemonProcess(backend_urls, tmp_path / "served", free_port())  # the daemon SIGKILLed, on the cluster
    served.env.update(MEMENTO_REDIS_URL=replicated.url, MEMENTO_FALKORDB_URL=falkordb(backend_urls),
                      MEMENTO_REPLICA_ACKS="1", MEMENTO_PRESENCE_IDLE=str(PRESENCE_IDLE), MEMENTO_LOG_LEVEL="error")
    report = dict[str, Any](fault=fault)
    agents = ["a", "b", "w"]  # w created the sessions and emits into them: present too
    async with running(make_settings(urls, tmp_path / "a", **settings)) as daemon, \
            rpc(daemon.port, token("w", namespace)) as writer, rpc(daemon.port, token("a", namespace)) as a, \
            rpc(daemon.port, token("b", namespace)) as b:
        groups = [await prepare(writer, [a, b], *pair_on(replicated, f"{namespace}-{fault}-{i}", primary))
                  for i, primary in enumerate(replicated.primaries())]
        emitted = {g.live: g.whole["session"]["seq"] for g in groups}
        assert list(emitted.values()) == [EMITTED] * len(groups)
        assert [await present(writer, g.live) for g in groups] == [agents] * len(groups)
        proc = await served.start()
        try:
            await anyio.sleep(0.2)  # the replicas have the writes (they keep up on loopback)
            moving = keys.session_keys(namespace, groups[0].live).session
            source = replicated.port_of(moving)
            with replicated.client(replica_of(replicated, source)) as node:  # presence is replicated like the rest
                node.execute_command("READONLY")
                fields = node.hkeys(keys.presence_key(namespace, groups[0].live))
            assert sorted({field.split("/")[0] for field in fields}) == agents, fields
            if fault == "failover":
                await anyio.to_thread.run_sync(kill_and_promote, replicated, source, report)
            else:
                target = next(port for port in replicated.primaries() if port != source)
                report["keys_moved"] = await anyio.to_thread.run_sync(
                    replicated.migrate, key_slot(moving.encode()), target)
            assert replicated.port_of(moving) != source
            # Reads right after the promotion (with MEMENTO_REPLICA_ACKS=1 the shard refuses emits until the killed
            # node is back as its replica); writes once it is.
            await check_presence(writer, groups, agents, report)
            for group in groups:
                await check_reads(writer, group)
            if fault == "failover":
                await anyio.to_thread.run_sync(rejoin, replicated, source, report)
            for group in groups:
                await check_writes(writer, group, emitted, f"after-{fault}")
            group = groups[0]
            group.whole = await writer.call("session.get", {"sessionId": group.live})
            async with rpc(served.port, token("w", namespace)) as through:  # the other daemon serves them too
                await check_reads(through, group)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc = await served.start()
            async with rpc(served.port, token("w", namespace)) as through:
                assert await present(through, group.live) == agents
                for group in groups:
                    group.whole = await writer.call("session.get", {"sessionId": group.live})
                    await check_reads(through, group)
                    await check_writes(through, group, emitted, "after-restart")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    print(f"{fault}:", report)
