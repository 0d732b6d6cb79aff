"""Presence covers every way in: an agent that joins or emits through MCP, the Claude Code hook or ingest is in
presence.get (who_is_here) at once, with no connection staying open, and gone once its visit ends."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, token
from tests.rpcsocket import RpcSocket, rpc
from tests.test_hook import hook_env, hook_input, run_hook
from tests.test_ingest_convert import FIXTURES
from tests.test_mcp import ok, over_http

pytestmark = pytest.mark.anyio
CLI = [sys.executable, "-m", "memento_sessions.cli"]


async def present(sock: RpcSocket, sid: str) -> list[tuple[str, str, int]]:
    agents = (await sock.call("presence.get", {"sessionId": sid}))["agents"]
    return [(a["agentId"], a["status"], a["connections"]) for a in agents]


async def announced(sock: RpcSocket, agent: str, status: str = "joined") -> dict[str, Any]:
    """The first session.presence of `agent` with `status` (others skipped)."""
    while True:
        params: dict[str, Any] = (await sock.notification("session.presence", timeout=5))["params"]
        if params["agentId"] == agent and params["status"] == status:
            return params


async def test_an_agent_working_through_mcp_is_here_until_it_leaves(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("w", namespace)) as ws, over_http(daemon.port, token("m", namespace)) as mcp:
        sid = (await ws.call("session.create", {}))["sessionId"]
        await ws.call("session.subscribe", {"sessionId": sid})
        ok(await mcp.call_tool("join_session", {"sessionId": sid}))
        assert await present(ws, sid) == [("m", "active", 0), ("w", "active", 1)]
        assert await announced(ws, "m") == {"sessionId": sid, "agentId": "m", "status": "joined"}
        here = ok(await mcp.call_tool("who_is_here", {"sessionId": sid}))
        assert [a["agentId"] for a in here["agents"]] == ["m", "w"]
        other = (await ws.call("session.create", {}))["sessionId"]
        ok(await mcp.call_tool("emit_event", {"sessionId": other, "event": {"type": "modified"}}))  # no join
        assert await present(ws, other) == [("m", "active", 0)]
        await ws.call("session.leave", {"sessionId": sid})
    async with rpc(daemon.port, token("m", namespace)) as m:  # a leave over any way in ends the visit
        await m.call("session.leave", {"sessionId": other})
        assert await present(m, other) == []


async def test_a_visit_ends_after_presence_visit_seconds(backend_urls: Endpoints, tmp_path: Path,
                                                         namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, presence_idle=0.6, presence_visit=1.5)  # a beat of 0.2 s
    async with running(settings) as d, rpc(d.port, token("w", namespace)) as ws, \
            over_http(d.port, token("m", namespace)) as mcp:
        sid = (await ws.call("session.create", {}))["sessionId"]
        await ws.call("session.subscribe", {"sessionId": sid})
        ok(await mcp.call_tool("emit_event", {"sessionId": sid, "event": {"type": "modified"}}))
        assert ("m", "active", 0) in await present(ws, sid)
        await anyio.sleep(1.0)
        assert ("m", "idle", 0) in await present(ws, sid)  # idle after presence_idle, still here
        assert await announced(ws, "m", "left") == {"sessionId": sid, "agentId": "m", "status": "left"}
        assert [a[0] for a in await present(ws, sid)] == ["w"]


async def test_an_agent_writing_through_the_claude_code_hook_is_here(daemon: Daemon, tmp_path: Path,
                                                                       namespace: str) -> None:
    env = hook_env(tmp_path, namespace, daemon.port)  # the token's agent is `claude`, the session's its own
    for n in range(2):
        done = await anyio.to_thread.run_sync(run_hook, env, hook_input("claude-here", n))
        assert done.returncode == 0
    # what a hook past its time budget spooled (a loaded host) goes now, as its next call would send it
    assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
    async with rpc(daemon.port, token("w", namespace)) as ws:
        assert await present(ws, "claude-here") == [("claude:claudehe", "active", 0)]


async def test_an_agent_ingesting_is_here(daemon: Daemon, namespace: str) -> None:
    env: dict[str, Any] = {**os.environ, "MEMENTO_TOKEN": token("ingester", namespace),
                           "MEMENTO_URL": f"ws://127.0.0.1:{daemon.port}/ws"}
    done = await anyio.run_process([*CLI, "ingest", str(FIXTURES / "spotter_tool_heavy.jsonl"), "--session",
                                    "ingested"], env=env, check=False)
    assert done.returncode == 0, done.stderr
    async with rpc(daemon.port, token("w", namespace)) as ws:
        assert await present(ws, "ingested") == [("ingester", "active", 0)]
