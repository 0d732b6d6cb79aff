"""The lifecycle under misuse and crashes: an id that Postgres holds is never taken by another session, a
stored row is never replaced by another epoch's, and a move cut short between its Redis and Postgres steps
leaves one authoritative copy, listed, with no seq reused in an epoch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.server.daemon import Daemon
from memento_sessions.sessions.lifecycle_methods import LifecycleService
from tests.helpers import token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


async def stored(dsn: str, namespace: str, session_id: str) -> tuple[str, int, str] | None:
    """(epoch, seq, status) of the stored row, if any."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow("SELECT epoch, seq, status FROM suspended_sessions WHERE namespace = $1 "
                                  "AND session_id = $2", namespace, session_id)
    finally:
        await conn.close()
    return (row[0], row[1], row[2]) if row else None


def service_of(daemon: Daemon) -> LifecycleService:
    assert daemon.services is not None
    return LifecycleService(daemon.services.manager, daemon.services.backends)


async def test_a_suspended_id_cannot_be_created_or_forked_onto(daemon: Daemon, namespace: str) -> None:
    dsn = daemon.settings.postgres_dsn or ""
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "kept", "entityIds": ["fn:a"]})
        await peer.call("event.emitBatch", {"sessionId": "kept", "events": [{"type": "modified", "id": f"e{i}"}
                                                                             for i in range(4)]})
        before = await peer.call("session.get", {"sessionId": "kept"})
        other = (await peer.call("session.create", {"entityIds": ["fn:b"]}))["sessionId"]
        suspended = await peer.call("session.suspend", {"sessionId": "kept"})
        row = await stored(dsn, namespace, "kept")
        for method, params in (("session.create", {"sessionId": "kept"}),
                               ("session.create", {"sessionId": "kept", "onIdle": "suspend"}),
                               ("session.fork", {"sessionId": other, "atSeq": 1, "newSessionId": "kept"})):
            error = await peer.error(method, params)
            assert error["code"] == -32009 and error["data"] == {"reason": "suspended"}, (method, params)
        assert await stored(dsn, namespace, "kept") == row == (suspended["epoch"], 5, "suspended")
        resumed = await peer.call("session.resume", {"sessionId": "kept"})
        assert resumed == {"sessionId": "kept", "status": "active", "seq": 5, "epoch": before["session"]["epoch"]}
        after = await peer.call("session.get", {"sessionId": "kept"})
        assert after["events"] == before["events"]


async def test_a_stored_row_is_never_replaced_by_another_epoch_s(daemon: Daemon, namespace: str) -> None:
    """A session that took a stored id anyway (its create raced the suspend) cannot overwrite the stored one."""
    dsn = daemon.settings.postgres_dsn or ""
    service = service_of(daemon)
    alice = Identity("alice", namespace, frozenset({"sessions:read", "sessions:write"}))
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "twice", "entityIds": ["fn:a"]})
        await peer.call("event.emit", {"sessionId": "twice", "event": {"type": "broke"}})
        first = await peer.call("session.suspend", {"sessionId": "twice"})
        await service.manager.create(alice, session_id="twice")  # straight to Redis, as a racing create would
        error = await peer.error("session.suspend", {"sessionId": "twice"})
        assert error["code"] == -32009 and error["data"] == {"reason": "suspended"}
        assert await stored(dsn, namespace, "twice") == (first["epoch"], 2, "suspended")


async def test_completed_and_archived_ids_are_refused_with_their_status(daemon: Daemon, namespace: str) -> None:
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    service = service_of(daemon)
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "done", "entityIds": ["fn:a"]})
        await peer.call("session.checkpoint", {"sessionId": "done", "final": True})
        assert await service.keep_completed([(namespace, "done")]) == 1
        await r.delete(*keys.session_keys(namespace, "done").all())  # its grace TTL ran out
        error = await peer.error("session.create", {"sessionId": "done"})
        assert error["code"] == -32009 and error["data"] == {"reason": "completed"}
        assert await service.archive(datetime.now(UTC) + timedelta(days=400)) >= 1
        error = await peer.error("session.fork", {"sessionId": "done", "atSeq": 1, "newSessionId": "x"})
        assert error["code"] == -32004  # an archived session has no events to fork
        error = await peer.error("session.create", {"sessionId": "done"})
        assert error["code"] == -32009 and error["data"] == {"reason": "archived"}
    await r.aclose()
