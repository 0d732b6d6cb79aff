"""bridge.isolate's `usage` is the isolated agent's share of the session's usage (what its own emits and
telemetry added), not the whole session's; the shares a session keeps are bounded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, token
from tests.rpcsocket import RpcSocket, rpc
from tests.test_mcp import over_http
from tests.test_usage_get import run_events

pytestmark = pytest.mark.anyio


async def runs_by(peer: RpcSocket, numbers: list[int]) -> None:
    """Runs numbered `numbers` emitted by `peer` into session `s`: run n outputs n tokens, odd runs cost n cents."""
    events = [event for n in numbers for event in run_events(n, n, n / 100 if n % 2 else None)]
    await peer.call("event.emitBatch", {"sessionId": "s", "events": events})


def picked(usage: dict[str, Any]) -> tuple[int, int, int, int, float | None]:
    return (usage["runs"], usage["inputTokens"], usage["outputTokens"], usage["costUnknownRuns"],
            None if usage["costUsd"] is None else round(usage["costUsd"], 6))


async def test_isolate_carries_the_agent_s_share_of_the_session_usage(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as alice, rpc(daemon.port, token("bob", namespace)) as bob:
        await alice.call("session.create", {"sessionId": "s"})
        await bob.call("session.join", {"sessionId": "s"})
        await runs_by(alice, [1, 2])
        await runs_by(bob, [3])
        await runs_by(alice, [4])
        session = (await alice.call("usage.get", {"sessionId": "s"}))["totals"]
        shares = {agent: (await alice.call("bridge.isolate", {"sessionId": "s", "agentId": agent}))["usage"]
                  for agent in ("alice", "bob", "carol")}
    assert picked(session) == (4, 400, 10, 2, 0.04)
    assert picked(shares["alice"]) == (3, 300, 7, 2, 0.01)
    assert picked(shares["bob"]) == (1, 100, 3, 0, 0.03)
    # carol added nothing: zero tokens, and no cost rather than a cost of 0.
    assert picked(shares["carol"]) == (0, 0, 0, 0, None)
    async with over_http(daemon.port, token("reader", namespace)) as mcp:
        reply = await mcp.call_tool("isolate_session", {"sessionId": "s", "agentId": "bob"})
    assert not reply.is_error and reply.structured_content["usage"] == shares["bob"]


async def test_shares_kept_per_session_are_bounded(backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, usage_agents_per_session=2)
    async with running(settings) as daemon:
        peers = {agent: rpc(daemon.port, token(agent, namespace)) for agent in ("a1", "a2", "a3")}
        async with peers["a1"] as a1, peers["a2"] as a2, peers["a3"] as a3:
            await a1.call("session.create", {"sessionId": "s"})
            for peer, n in ((a1, 1), (a2, 2), (a3, 3)):
                if peer is not a1:
                    await peer.call("session.join", {"sessionId": "s"})
                await runs_by(peer, [n])
            session = (await a1.call("usage.get", {"sessionId": "s"}))["totals"]
            shares = {agent: (await a1.call("bridge.isolate", {"sessionId": "s", "agentId": agent}))["usage"]
                      for agent in ("a1", "a2", "a3")}
    assert picked(session) == (3, 300, 6, 1, 0.04)  # the session's totals keep everyone's
    assert picked(shares["a1"])[:3] == (1, 100, 1) and picked(shares["a2"])[:3] == (1, 100, 2)
    assert shares["a3"] is None  # past the bound: no share kept, said as such rather than as zero
