"""Task claims: one winner among racing agents, and the winner's fencing token required on the completion."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio
import pytest

from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = pytest.mark.anyio
RACERS = 50


def done(task: str, fencing: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "task_done", "changeInfo": {"entityIds": [f"task:{task}"]}}
    if fencing is not None:
        event["fencingToken"] = fencing
    return event


async def test_fifty_agents_racing_for_a_task_give_exactly_one_winner(daemon: Daemon, namespace: str) -> None:
    async with AsyncExitStack() as stack:
        agents: list[RpcSocket] = [await stack.enter_async_context(rpc(daemon.port, token(f"agent{i}", namespace)))
                                   for i in range(RACERS)]
        replies: list[dict[str, Any]] = [{} for _ in agents]

        async def claim(i: int) -> None:
            replies[i] = await agents[i].call("lease.acquire", {"entityIds": ["task:t1"], "ttl": 60,
                                                                "mode": "exclusive"})

        async with anyio.create_task_group() as tg:
            for i in range(RACERS):
                tg.start_soon(claim, i)
        winners = [i for i, reply in enumerate(replies) if reply["granted"]]
        assert len(winners) == 1
        winner = replies[winners[0]]
        losers = [reply for reply in replies if not reply["granted"]]
        assert len(losers) == RACERS - 1
        assert {(c["heldBy"], c["leaseId"]) for reply in losers for c in reply["conflicts"]} == \
            {(f"agent{winners[0]}", winner["leaseId"])}
        listed = (await agents[0].call("lease.list", {"entityId": "task:t1"}))["leases"]
        assert [lease["leaseId"] for lease in listed] == [winner["leaseId"]]


async def test_a_task_is_completed_only_with_its_current_claims_fencing_token(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        await b.call("session.join", {"sessionId": sid})
        never = await a.error("event.emit", {"sessionId": sid, "event": done("t2", 1)})
        assert never["code"] == -32009 and never["data"] == {"reason": "stale_lease", "entityId": "task:t2"}

        first = await a.call("lease.acquire", {"entityIds": ["task:t2"], "ttl": 60})
        untokened = await a.error("event.emit", {"sessionId": sid, "event": done("t2")})
        assert untokened["code"] == -32009 and untokened["data"]["reason"] == "stale_lease"
        await a.call("lease.release", {"leaseId": first["leaseId"]})
        second = await b.call("lease.acquire", {"entityIds": ["task:t2"], "ttl": 60})
        stale = await a.error("event.emit", {"sessionId": sid, "event": done("t2", first["fencingToken"])})
        assert stale["code"] == -32009 and stale["data"]["reason"] == "stale_lease"
        batch = await a.error("event.emitBatch", {"sessionId": sid, "events": [
            {"type": "note"}, done("t2", first["fencingToken"])]})
        assert batch["code"] == -32009
        assert (await a.call("session.get", {"sessionId": sid}))["session"]["seq"] == 0  # nothing written

        ok = await b.call("event.emit", {"sessionId": sid, "event": done("t2", second["fencingToken"])})
        assert ok == {"seq": 1, "duplicate": False}
        other = await b.call("event.emit", {"sessionId": sid, "event": {"type": "note", "changeInfo": {
            "entityIds": ["task:t2"]}}})  # only completions need the token
        assert other["seq"] == 2


async def test_the_claim_task_tool_claims_task_entities(daemon: Daemon, namespace: str) -> None:
    from tests.test_mcp import ok, over_http

    async with over_http(daemon.port, token("m", namespace)) as mcp, rpc(daemon.port, token("w", namespace)) as ws:
        mine = ok(await mcp.call_tool("claim_task", {"taskId": "t3", "ttl": 60, "reason": "fix it"}))
        assert mine["granted"] is True and mine["fencingToken"] >= 1
        theirs = await ws.call("lease.acquire", {"entityIds": ["task:t3"], "ttl": 60})
        assert theirs["granted"] is False and theirs["conflicts"][0]["heldBy"] == "m"
        again = ok(await mcp.call_tool("claim_task", {"taskId": "t3", "ttl": 60}))
        assert again["granted"] is True  # an agent never conflicts with itself
        bad = await mcp.call_tool("claim_task", {"taskId": "bad id", "ttl": 60})
        assert bad.is_error and "taskId" in str(bad.content)
