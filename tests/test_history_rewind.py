"""A session's history that goes back under its subscribers: what a failover that lost writes leaves.

Redis replicates asynchronously and a session's frames are published when its primary writes the event, so
a failover can lose events that subscribers already got: the promoted replica's session has a lower seq and
hands the lost seqs out again. Here that state is made directly on the one Redis of the test (the last events
and their seq removed, as the replica never had them) and the daemon's pub/sub connection is killed, as the
failover kills it; tests/test_cluster_faults.py makes it with a real failover on a cluster.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.client import Client, HistoryLost
from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = [pytest.mark.anyio, pytest.mark.topology_independent]


async def lose_the_last(r: aioredis.Redis, namespace: str, sid: str, kept: int, ids: list[str]) -> None:
    """What the promoted replica holds: the events after `kept` never reached it."""
    skeys = keys.session_keys(namespace, sid)
    await r.zremrangebyscore(skeys.events, kept + 1, "+inf")
    await r.hset(skeys.session, "seq", kept)
    await r.hdel(skeys.ids, *ids)
    assert await r.client_kill_filter(_type="pubsub") >= 1  # the failover ends the daemon's pub/sub connection


async def events(peer: RpcSocket, count: int) -> list[dict[str, Any]]:
    with anyio.fail_after(10):
        return [(await peer.notification("session.event"))["params"] for _ in range(count)]


def batch(*ids: str) -> dict[str, Any]:
    return {"events": [{"type": "modified", "id": event_id} for event_id in ids]}


async def test_a_subscriber_ahead_of_a_history_that_went_back_is_told_and_gets_it_anew_in_a_new_epoch(
        daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with rpc(daemon.port, token("w", namespace)) as w, rpc(daemon.port, token("s", namespace)) as s, \
            rpc(daemon.port, token("t", namespace)) as t:
        sid = (await w.call("session.create", {}))["sessionId"]
        old = (await s.call("session.subscribe", {"sessionId": sid}))["epoch"]
        await w.call("event.emitBatch", {"sessionId": sid, **batch("e1", "e2", "e3", "e4", "e5")})
        assert [p["seq"] for p in await events(s, 5)] == [1, 2, 3, 4, 5]
        await lose_the_last(r, namespace, sid, 3, ["e4", "e5"])
        with anyio.fail_after(10):
            recovery = (await s.notification("session.recovery"))["params"]
        new = (await w.call("session.get", {"sessionId": sid}))["session"]["epoch"]
        assert recovery == {"sessionId": sid, "seq": 0, "epoch": new, "recovered": False} and new != old
        # The next events take seqs 4 and 5 again, in the new epoch: the subscriber gets the stored history
        # anew, once and in order, then them.
        assert (await w.call("event.emitBatch", {"sessionId": sid, **batch("f1", "f2")}))["seqs"] == [4, 5]
        got = [(p["seq"], p["epoch"], p["event"]["id"]) for p in await events(s, 5)]
        assert got == [(1, new, "e1"), (2, new, "e2"), (3, new, "e3"), (4, new, "f1"), (5, new, "f2")]
        # A client resuming after seq 5 of the old epoch is not told its seq 5 is there: it was another event.
        resumed = await t.call("session.subscribe", {"sessionId": sid, "since": 5, "epoch": old})
        assert resumed == {"seq": 5, "epoch": new, "recovered": False}
        with anyio.move_on_after(0.5):
            await s.notification("session.event")
            pytest.fail("an event delivered twice")
    await r.aclose()


async def test_the_client_raises_history_lost_then_goes_on_in_the_new_epoch(daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    url = f"ws://127.0.0.1:{daemon.port}/ws"
    async with Client(url, token("w", namespace)) as writer, Client(url, token("r", namespace)) as reader:
        sid = (await writer.create_session())["sessionId"]
        async with reader.subscribe(sid) as sub:
            await writer.emit_batch(sid, [{"type": "modified", "id": f"e{i}"} for i in range(1, 5)])
            with anyio.fail_after(5):
                assert [(await sub.__anext__()).seq for _ in range(4)] == [1, 2, 3, 4]
            old = sub.epoch
            await lose_the_last(r, namespace, sid, 2, ["e3", "e4"])
            with pytest.raises(HistoryLost) as lost, anyio.fail_after(10):
                await sub.__anext__()
            assert (lost.value.last_seq, lost.value.seq) == (4, 0) and lost.value.epoch not in (None, old)
            await writer.emit(sid, {"type": "broke", "id": "after"})
            with anyio.fail_after(5):
                got = [(e.seq, e.event["id"]) for e in [await sub.__anext__() for _ in range(3)]]
            assert got == [(1, "e1"), (2, "e2"), (3, "after")] and sub.epoch == lost.value.epoch
    await r.aclose()
