"""Usage of sessions Redis no longer holds: `session.get {condensed: true}` of a suspended or completed session
answers its usage totals from the stored row, as a live one does (and after its usage keys expired)."""

from __future__ import annotations

from pathlib import Path

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.endpoints import Endpoints
from memento_sessions.lifecycle.methods import LifecycleService
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc
from tests.test_usage_get import run_events

pytestmark = pytest.mark.anyio


def three_runs() -> list[dict[str, object]]:
    """Runs 1-3: run n outputs n tokens after 100 input tokens; runs 1 and 3 cost n cents, run 2 gave no cost."""
    return [event for n in (1, 2, 3) for event in run_events(n, n, n / 100 if n % 2 else None)]


async def drop_usage_keys(redis_url: str, namespace: str, session_id: str) -> None:
    """What MEMENTO_USAGE_TTL does in time: the session's usage keys are gone from Redis."""
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for key in keys.usage_keys(namespace, session_id).all():
            await r.delete(key)
    finally:
        await r.aclose()


async def test_a_suspended_session_carries_its_usage_like_a_live_one(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "s"})
        await peer.call("event.emitBatch", {"sessionId": "s", "events": three_runs()})
        live = (await peer.call("session.get", {"sessionId": "s", "condensed": True}))["usage"]
        assert (live["runs"], live["inputTokens"], live["outputTokens"], live["costUnknownRuns"]) == (3, 300, 6, 1)
        assert live["costUsd"] == pytest.approx(0.04)
        await peer.call("session.suspend", {"sessionId": "s"})
        stored = await peer.call("session.get", {"sessionId": "s", "condensed": True})
        assert stored["session"]["status"] == "suspended" and stored["usage"] == live
        # Kept with the row: the usage keys' own TTL running out in Redis loses nothing.
        await drop_usage_keys(daemon.settings.redis_url or "", namespace, "s")
        assert (await peer.call("session.get", {"sessionId": "s", "condensed": True}))["usage"] == live
        # A row stored before usage was kept with it reads the usage keys while Redis has them.
        await peer.call("session.resume", {"sessionId": "s"})
        await peer.call("event.emitBatch", {"sessionId": "s", "events": run_events(4, 10, 0.5)})
        await peer.call("session.suspend", {"sessionId": "s"})
        conn = await asyncpg.connect(daemon.settings.postgres_dsn)
        try:
            await conn.execute("UPDATE suspended_sessions SET summary = summary - 'usage' WHERE namespace = $1",
                               namespace)
        finally:
            await conn.close()
        older = (await peer.call("session.get", {"sessionId": "s", "condensed": True}))["usage"]
        assert (older["runs"], older["outputTokens"], older["costUnknownRuns"]) == (1, 10, 0)
        assert older["costUsd"] == pytest.approx(0.5)


async def test_a_completed_session_carries_its_usage_once_redis_let_it_go(backend_urls: Endpoints, tmp_path: Path,
                                                                         namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, checkpoint_grace_ttl=2)
    r = aioredis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    async with running(settings) as daemon, rpc(daemon.port, token("alice", namespace)) as peer:
        assert daemon.services is not None
        await peer.call("session.create", {"sessionId": "done"})
        await peer.call("event.emitBatch", {"sessionId": "done", "events": three_runs()})
        live = (await peer.call("session.get", {"sessionId": "done", "condensed": True}))["usage"]
        await peer.call("session.checkpoint", {"sessionId": "done", "final": True})
        service = LifecycleService(daemon.services.manager, daemon.services.backends)
        assert await service.keep_completed([(namespace, "done")]) == 1
        with anyio.fail_after(10):
            while await r.exists(keys.session_keys(namespace, "done").session):  # the grace TTL runs out
                await anyio.sleep(0.2)
        await drop_usage_keys(settings.redis_url or "", namespace, "done")
        stored = await peer.call("session.get", {"sessionId": "done", "condensed": True})
    await r.aclose()
    assert stored["session"]["status"] == "completed" and stored["usage"] == live
    assert (live["runs"], live["outputTokens"]) == (3, 6)
