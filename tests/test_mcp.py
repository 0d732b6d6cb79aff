"""The MCP tools with the SDK's own client, over streamable HTTP (/mcp) and stdio (`memento-sessions mcp`).

Every tool runs its JSON-RPC method, so what an MCP client sees is compared with what a WebSocket
client gets for the same call, on the same daemon and the same Redis.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jwt
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from memento_sessions.bridge.methods import IsolateParams
from memento_sessions.endpoints import Endpoints
from memento_sessions.errors import ConfigError
from memento_sessions.mcp.http import serve_mcp
from memento_sessions.mcp.tools import build_server
from memento_sessions.mcp.tools_coordination import NAMES as COORDINATION
from memento_sessions.mcp.tools_lifecycle import NAMES as LIFECYCLE
from memento_sessions.rpc import Registry
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.sessions.methods import GetParams, ListParams
from memento_sessions.settings import Settings, load_settings
from tests.helpers import SECRET, falkordb_url, make_settings, token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = pytest.mark.anyio

TOOLS = {"create_session", "join_session", "emit_event", "get_session", "list_sessions", "checkpoint_session",
         "get_transitions", "isolate_session", "get_handoff_context", "session_outcomes", "get_conversation",
         "usage", *COORDINATION, *LIFECYCLE}  # their shapes: tests/test_mailbox.py, tests/test_lifecycle.py
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

Connect = Callable[[str], AbstractAsyncContextManager[ClientSession]]
CHECKPOINT_EVERY = 10_000  # no automatic checkpoint lands between the MCP read and the WebSocket read


@pytest.fixture
def settings(backend_urls: Endpoints, tmp_path: Path) -> Settings:
    return make_settings(backend_urls, tmp_path, checkpoint_every=CHECKPOINT_EVERY)


@asynccontextmanager
async def over_http(port: int, tok: str) -> AsyncIterator[ClientSession]:
    """An initialized SDK session on the daemon's /mcp with `tok` as bearer token."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {tok}"}) as http, \
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


def stdio_env(urls: Endpoints, data_dir: Path, tok: str | None) -> dict[str, str]:
    env = {"MEMENTO_REDIS_URL": urls.redis_url, "MEMENTO_POSTGRES_DSN": urls.postgres_dsn or "off",
           "MEMENTO_AUTH_SECRET": SECRET, "MEMENTO_DATA_DIR": str(data_dir), "MEMENTO_LOG_LEVEL": "warning",
           "MEMENTO_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY)}
    graphs = falkordb_url(urls)  # a cluster's URL needs the standalone FalkorDB's beside it
    return env | ({"MEMENTO_TOKEN": tok} if tok else {}) | ({"MEMENTO_FALKORDB_URL": graphs} if graphs else {})


@asynccontextmanager
async def over_stdio(urls: Endpoints, data_dir: Path, tok: str) -> AsyncIterator[ClientSession]:
    """An initialized SDK session on a spawned `memento-sessions mcp` with MEMENTO_TOKEN=`tok`."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "memento_sessions.cli", "mcp"],
                                   env=stdio_env(urls, data_dir, tok), cwd=str(data_dir))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@pytest.fixture(params=["http", "stdio"])
def connect(request: pytest.FixtureRequest, daemon: Daemon, backend_urls: Endpoints, tmp_path: Path) -> Connect:
    """Open an MCP client of either transport for a token, beside the `daemon` WebSocket clients use."""
    if request.param == "http":
        return partial(over_http, daemon.port)
    return partial(over_stdio, backend_urls, tmp_path)


def ok(result: CallToolResult) -> dict[str, Any]:
    """The structured result of a call that must succeed."""
    assert not result.is_error, result.content
    assert result.structured_content is not None
    structured: dict[str, Any] = result.structured_content
    return structured


def failed(result: CallToolResult) -> str:
    """The error text of a call that must fail."""
    assert result.is_error, result.structured_content
    text: str = result.content[0].text  # type: ignore[union-attr]
    return text


def steady(value: Any) -> Any:
    """`value` without `expiresAt`, which is computed from the TTL left at the moment of each read."""
    if isinstance(value, dict):
        return {key: steady(item) for key, item in value.items() if key != "expiresAt"}
    if isinstance(value, list):
        return [steady(item) for item in value]
    return value


async def test_lists_the_ten_tools_each_with_schemas_and_a_description(connect: Connect, namespace: str) -> None:
    async with connect(token("lister", namespace)) as mcp:
        tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name
        assert tool.description is not None and len(tool.description) > 150, tool.name
    emit = tools["emit_event"].input_schema
    assert emit["required"] == ["sessionId", "event"]
    assert emit["properties"]["sessionId"]["pattern"] == "^[A-Za-z0-9._:-]{1,128}$"
    assert emit["$defs"]["EventIn"]["properties"]["type"]["pattern"] == "^[a-z][a-z0-9_.:-]{0,63}$"
    assert tools["get_session"].annotations is not None and tools["get_session"].annotations.read_only_hint


async def test_create_emit_and_read_show_what_a_websocket_client_sees(connect: Connect, daemon: Daemon,
                                                                      namespace: str) -> None:
    async with connect(token("mcp-agent", namespace)) as mcp, rpc(daemon.port, token("ws-agent", namespace)) as ws:
        created = ok(await mcp.call_tool("create_session", {"entityIds": ["fn:login", "fn:logout"],
                                                            "labels": {"task": "auth"}}))
        sid = created["sessionId"]
        assert created["seq"] == 1 and created["state"] == "working" and created["agentIds"] == ["mcp-agent"]
        broke = {"type": "broke", "id": "e-2", "changeInfo": {"entityIds": ["fn:login"], "operation": "modified"},
                 "impact": {"severity": "high", "perfDelta": 12.5}}
        assert ok(await mcp.call_tool("emit_event", {"sessionId": sid, "event": broke})) == {"seq": 2,
                                                                                           "duplicate": False}
        assert ok(await mcp.call_tool("emit_event", {"sessionId": sid, "event": broke})) == {"seq": 2,
                                                                                           "duplicate": True}
        await ws.call("session.join", {"sessionId": sid})
        await ws.call("event.emit", {"sessionId": sid, "event": {"type": "test_pass"}})
        joined = ok(await mcp.call_tool("join_session", {"sessionId": sid}))
        assert joined == {"sessionId": sid, "agentIds": ["mcp-agent", "ws-agent"], "state": "working", "seq": 3}

        seen = ok(await mcp.call_tool("get_session", {"sessionId": sid}))
        assert [(e["seq"], e["type"], e["actor"]) for e in seen["events"]] == [
            (1, "start", "mcp-agent"), (2, "broke", "mcp-agent"), (3, "test_pass", "ws-agent")]
        assert steady(seen) == steady(await ws.call("session.get", {"sessionId": sid}))
        condensed = {"sessionId": sid, "condensed": True}
        assert steady(ok(await mcp.call_tool("get_session", condensed))) == steady(
            await ws.call("session.get", condensed))
        listed = ok(await mcp.call_tool("list_sessions", {"state": "working"}))
        assert [s["sessionId"] for s in listed["sessions"]] == [sid]
        assert steady(listed) == steady(await ws.call("session.list", {"state": "working"}))


async def test_bad_arguments_return_an_error_naming_the_field_and_write_nothing(connect: Connect, daemon: Daemon,
                                                                              namespace: str) -> None:
    async with connect(token("careless", namespace)) as mcp, rpc(daemon.port, token("watcher", namespace)) as ws:
        sid = (await ws.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await ws.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}})
        # Caught by the tool's input schema (the same pydantic types as the method's params), in the same format.
        text = failed(await mcp.call_tool("emit_event", {"sessionId": sid, "event": {"type": "Not A Type"}}))
        assert text == ("Error executing tool emit_event: invalid params (-32602); event.type: String should match "
                        "pattern '^[a-z][a-z0-9_.:-]{0,63}$'")
        text = failed(await mcp.call_tool("emit_event", {"sessionId": sid,
                                                         "event": {"type": "modified", "colour": "red"}}))
        assert text == ("Error executing tool emit_event: invalid params (-32602); event.colour: Extra inputs are not "
                        "permitted")
        # Caught by the method itself: the JSON-RPC error's code, message and fields.
        text = failed(await mcp.call_tool("emit_event", {"sessionId": sid,
                                                         "event": {"type": "modified", "actor": "someone-else"}}))
        assert text.endswith("actor differs from the token's agent (-32001); event.actor: must be 'careless' "
                             "(the token's agent) or absent")
        text = failed(await mcp.call_tool("create_session", {"sessionId": "mine", "ttl": 7200}))
        assert text.endswith("invalid params (-32602); ttl: at most 3600 (MEMENTO_SESSION_TTL)")
        after = await ws.call("session.get", {"sessionId": sid})
        assert after["session"]["seq"] == 2 and len(after["events"]) == 2
        assert (await ws.error("session.get", {"sessionId": "mine"}))["code"] == -32004


async def test_out_of_range_arguments_and_unknown_tools_get_the_one_error_format(connect: Connect,
                                                                                namespace: str) -> None:
    async with connect(token("sloppy", namespace)) as mcp:
        calls: list[tuple[str, dict[str, Any], str]] = [
                 ("get_session", {"sessionId": "s", "limit": 0}, "limit: Input should be greater than or equal to 1"),
                 ("list_sessions", {"limit": 501}, "limit: Input should be less than or equal to 500"),
                 ("session_outcomes", {"clusterId": "c", "days": 366},
                  "days: Input should be less than or equal to 365"),
                 ("create_session", {"ttl": 30}, "ttl: Input should be greater than or equal to 60"),
                 ("create_session", {"labels": {f"k{n}": "v" for n in range(33)}},
                  "labels: Dictionary should have at most 32 items after validation, not more")]
        for tool, args, detail in calls:
            text = failed(await mcp.call_tool(tool, args))
            assert text == f"Error executing tool {tool}: invalid params (-32602); {detail}", text
            assert "pydantic" not in text and "validation error" not in text
        text = failed(await mcp.call_tool("drop_tables", {}))
        assert text == "Error executing tool drop_tables: unknown tool (-32601); tool: drop_tables"
        assert ok(await mcp.call_tool("list_sessions", {}))["sessions"] == [], "none of those made a session"


def dead_port() -> int:
    """A local port where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(("backend", "name", "override"), [
    ("postgres", "Postgres", "postgres_dsn"), ("redis", "Redis", "redis_url"),
    ("falkordb", "FalkorDB", "falkordb_url")])
async def test_an_unavailable_backend_is_named_to_clients_and_detailed_only_in_the_log(
        backend_urls: Endpoints, tmp_path: Path, namespace: str, backend: str, name: str, override: str) -> None:
    port = dead_port()
    url = f"postgresql://memento:pw@127.0.0.1:{port}/memento" if backend == "postgres" else f"redis://127.0.0.1:{port}"
    async with running(make_settings(backend_urls, tmp_path, **{override: url})) as daemon, \
            rpc(daemon.port, token("asker", namespace)) as ws, over_http(daemon.port, token("asker", namespace)) as mcp:
        with capture_logs() as logs:
            # Redis first, then (not live) the KG anchors and the Postgres snapshot.
            reply = await ws.request("bridge.handoff", {"sessionId": "gone"})
            text = failed(await mcp.call_tool("get_handoff_context", {"sessionId": "gone"}))
    assert reply["error"] == {"code": -32050, "message": f"backend unavailable: {name}", "data": {"backend": backend}}
    assert text == f"Error executing tool get_handoff_context: backend unavailable: {name} (-32050); backend: {backend}"
    failures = [entry for entry in logs if entry["event"] == "backend unavailable"]
    assert [(entry["backend"], entry["method"]) for entry in failures] == [(backend, "bridge.handoff")] * 2
    assert failures[0]["request_id"] == reply["id"] and failures[1]["request_id"] is not None
    assert all(str(port) in entry["error"] for entry in failures), "the driver's details go to the log"


async def test_a_client_of_namespace_a_cannot_read_or_write_a_session_of_namespace_b(
        connect: Connect, daemon: Daemon, namespace: str) -> None:
    other = namespace + "b"
    async with rpc(daemon.port, token("owner", other)) as owner:
        sid = (await owner.call("session.create", {"entityIds": ["fn:secret"]}))["sessionId"]
        async with connect(token("owner", namespace)) as intruder:
            for tool, args in [("get_session", {}), ("join_session", {}),
                               ("emit_event", {"event": {"type": "broke"}})]:
                text = failed(await intruder.call_tool(tool, {"sessionId": sid, **args}))
                assert "not found (-32004)" in text, (tool, text)
            assert ok(await intruder.call_tool("list_sessions", {}))["sessions"] == []
        after = await owner.call("session.get", {"sessionId": sid})
    assert after["session"]["seq"] == 1 and after["session"]["agentIds"] == ["owner"]
    assert after["session"]["state"] == "working"


async def test_checkpoint_session_runs_session_checkpoint(connect: Connect, daemon: Daemon, namespace: str) -> None:
    async with connect(token("fixer", namespace)) as mcp, rpc(daemon.port, token("ws", namespace)) as ws:
        sid = ok(await mcp.call_tool("create_session", {"entityIds": ["fn:cp"]}))["sessionId"]
        event = {"type": "broke", "changeInfo": {"entityIds": ["fn:cp"]}, "impact": {"perfDelta": 3.0}}
        ok(await mcp.call_tool("emit_event", {"sessionId": sid, "event": event}))
        done = ok(await mcp.call_tool("checkpoint_session", {"sessionId": sid, "final": True}))
        assert done["outcome"] == "broken" and done["brokeDuring"] is True and done["perfDelta"] == 3.0
        assert done["actors"] == ["fixer"] and done["entityIds"] == ["fn:cp"]
        session = (await ws.call("session.get", {"sessionId": sid}))["session"]
    assert session["state"] == "completed"
    assert session["lastCheckpoint"]["id"] == done["checkpointId"]


async def feed_bridge(mcp: ClientSession, ws: RpcSocket) -> str:
    """A session two agents worked in: 12 changes, one breakage and its fix."""
    sid = ok(await mcp.call_tool("create_session", {"entityIds": ["fn:pay"]}))["sessionId"]
    await ws.call("session.join", {"sessionId": sid})
    for n in range(12):
        event: dict[str, Any] = {"type": "modified", "changeInfo": {"entityIds": [f"fn:pay{n % 3}"]},
                                 "impact": {"perfDelta": 1.0}}
        if n == 5:
            event["type"] = "broke"
        if n == 8:
            event["type"] = "test_pass"
        ok(await mcp.call_tool("emit_event", {"sessionId": sid, "event": event}))
    await ws.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "impact": {"perfDelta": 4.0}}})
    return str(sid)


async def test_handoff_context_shows_what_a_websocket_client_sees(connect: Connect, daemon: Daemon,
                                                                  namespace: str) -> None:
    async with connect(token("lead", namespace)) as mcp, rpc(daemon.port, token("helper", namespace)) as ws:
        sid = await feed_bridge(mcp, ws)
        handoff = ok(await mcp.call_tool("get_handoff_context", {"sessionId": sid}))
        assert handoff["sessionId"] == sid and handoff["agentIds"] == ["helper", "lead"]
        assert len(handoff["recentChanges"]) == 10
        assert steady(handoff) == steady(await ws.call("bridge.handoff", {"sessionId": sid}))


async def test_bridge_tools_return_the_bridge_methods_results(connect: Connect, daemon: Daemon,
                                                             namespace: str) -> None:
    async with connect(token("lead", namespace)) as mcp, rpc(daemon.port, token("helper", namespace)) as ws:
        sid = await feed_bridge(mcp, ws)
        calls: list[tuple[str, str, dict[str, Any]]] = [
                 ("get_transitions", "bridge.transitions", {"sessionId": sid}),
                 ("isolate_session", "bridge.isolate", {"sessionId": sid, "agentId": "helper"}),
                 ("session_outcomes", "bridge.outcomes", {"clusterId": "cluster:none", "days": 7})]
        for tool, method, args in calls:
            assert steady(ok(await mcp.call_tool(tool, args))) == steady(await ws.call(method, args)), tool
        isolated = ok(await mcp.call_tool("isolate_session", {"sessionId": sid, "agentId": "helper"}))
    assert isolated["totalPerfDelta"] == 4.0 and len(isolated["events"]) == 1


def forged(agent: str, namespace: str) -> str:
    claims = {"sub": agent, "ns": namespace, "scope": "sessions:read", "exp": int(time.time()) + 60}
    return jwt.encode(claims, "another-secret-that-is-long-enough-0123456789", algorithm="HS256")


async def test_http_needs_a_valid_token_a_known_host_and_a_known_session(daemon: Daemon, namespace: str) -> None:
    url = f"http://127.0.0.1:{daemon.port}/mcp"
    good = {**HEADERS, "authorization": f"Bearer {token('alice', namespace)}"}
    async with httpx2.AsyncClient() as http:
        missing = await http.post(url, json=INIT, headers=HEADERS)
        assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer ")
        for bad in (token("alice", namespace, ttl=-10), forged("alice", namespace), "not-a-jwt"):
            response = await http.post(url, json=INIT, headers={**HEADERS, "authorization": f"Bearer {bad}"})
            assert response.status_code == 401, bad
        assert (await http.post(url, json=INIT, headers={**good, "host": "evil.example:80"})).status_code == 421
        local = {**good, "host": f"localhost:{daemon.port}"}
        assert (await http.post(url, json=INIT, headers=local)).status_code == 200
        assert (await http.post(url, json=INIT, headers={**good, "origin": "http://evil.example"})).status_code == 403
        opened = await http.post(url, json=INIT, headers=good)
        assert opened.status_code == 200, "POST /mcp is served as it is, not redirected"
        session_id = opened.headers["mcp-session-id"]
        unknown = await http.post(url, json=LIST, headers={**good, "mcp-session-id": "0" * 32})
        assert unknown.status_code == 404 and "Session not found" in unknown.text
        bob = {**HEADERS, "authorization": f"Bearer {token('bob', namespace)}", "mcp-session-id": session_id}
        assert (await http.post(url, json=LIST, headers=bob)).status_code == 404, "a session belongs to its opener"
        same_agent_other_ns = {**HEADERS, "authorization": f"Bearer {token('alice', namespace + 'x')}",
                               "mcp-session-id": session_id}
        assert (await http.post(url, json=LIST, headers=same_agent_other_ns)).status_code == 404
        assert (await http.delete(url, headers={**good, "mcp-session-id": session_id})).status_code == 200
        assert (await http.post(url, json=LIST, headers={**good, "mcp-session-id": session_id})).status_code == 404


async def test_each_http_request_runs_as_the_token_it_carries(daemon: Daemon, namespace: str) -> None:
    writer = token("alice", namespace)
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {writer}"}) as http, \
            streamable_http_client(f"http://127.0.0.1:{daemon.port}/mcp", http_client=http) as (read, write), \
            ClientSession(read, write) as mcp:
        await mcp.initialize()
        sid = ok(await mcp.call_tool("create_session", {}))["sessionId"]
        http.headers["Authorization"] = f"Bearer {token('alice', namespace, scope='sessions:read')}"
        text = failed(await mcp.call_tool("emit_event", {"sessionId": sid, "event": {"type": "modified"}}))
        assert text.endswith("token lacks scope sessions:write (-32001); scope: sessions:write")
        assert ok(await mcp.call_tool("get_session", {"sessionId": sid}))["session"]["seq"] == 0
        http.headers["Authorization"] = f"Bearer {writer}"
        assert ok(await mcp.call_tool("emit_event", {"sessionId": sid, "event": {"type": "modified"}}))["seq"] == 1


@pytest.mark.parametrize("tok", [None, "not-a-jwt"])
def test_stdio_refuses_to_start_without_a_valid_token(backend_urls: Endpoints, tmp_path: Path,
                                                      tok: str | None) -> None:
    env = {key: value for key, value in os.environ.items() if key != "MEMENTO_TOKEN"}
    env |= stdio_env(backend_urls, tmp_path, tok)
    done = subprocess.run([sys.executable, "-m", "memento_sessions.cli", "mcp"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "MEMENTO_TOKEN" in done.stderr


async def test_an_agent_over_its_mcp_rate_gets_32029_and_those_calls_do_nothing(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path, mcp_rate_limit=3)) as daemon, \
            over_http(daemon.port, token("eager", namespace)) as eager, \
            over_http(daemon.port, token("calm", namespace)) as calm:
        results = [await eager.call_tool("create_session", {}) for _ in range(8)]
        made = [ok(result)["sessionId"] for result in results if not result.is_error]
        refused = [failed(result) for result in results if result.is_error]
        assert 3 <= len(made) <= 5 and refused, "a burst of 3, then what refilled at 3/s during the calls"
        assert all("rate limited (-32029); retryAfterMs: " in text for text in refused), refused
        listed = ok(await calm.call_tool("list_sessions", {}))["sessions"]  # another agent: its own bucket
        assert sorted(session["sessionId"] for session in listed) == sorted(made), "a refused call made nothing"
        await anyio.sleep(1.0)
        assert not (await eager.call_tool("list_sessions", {})).is_error, "tokens come back at the rate"


async def test_hosts_named_in_mcp_allowed_hosts_are_served_others_get_421(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, mcp_allowed_hosts="memento.example.com, 10.0.0.5:8443")
    async with running(settings) as daemon, httpx2.AsyncClient() as http:
        url = f"http://127.0.0.1:{daemon.port}/mcp"
        good = {**HEADERS, "authorization": f"Bearer {token('alice', namespace)}"}

        async def status(**headers: str) -> int:
            return (await http.post(url, json=INIT, headers={**good, **headers})).status_code

        assert await status(host="memento.example.com", origin="https://memento.example.com") == 200
        assert await status(host="10.0.0.5:8443") == 200
        assert await status(host=f"localhost:{daemon.port}") == 200, "the daemon's own names still work"
        assert await status(host="memento.example.com:9999") == 421, "a name without a port means that name only"
        assert await status(host="10.0.0.5") == 421
        assert await status(host="evil.example") == 421
        assert await status(host="memento.example.com", origin="https://evil.example") == 403


@pytest.mark.parametrize("value", ["memento.example.com/path", "http://memento.example.com", "a b", "host:port"])
def test_a_bad_mcp_allowed_hosts_entry_is_refused_at_start(value: str) -> None:
    with pytest.raises(ConfigError, match="MEMENTO_MCP_ALLOWED_HOSTS"):
        load_settings(mcp_allowed_hosts=f"ok.example,{value}")


async def open_session(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> str:
    """A new MCP session's id (the SDK's answer to initialize)."""
    opened = await http.post(url, json=INIT, headers=headers)
    assert opened.status_code == 200, opened.text
    return str(opened.headers["mcp-session-id"])


async def test_an_agent_at_its_mcp_session_limit_loses_its_oldest_idle_session_not_others(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path, mcp_max_sessions=2)) as daemon, \
            httpx2.AsyncClient() as http:
        url = f"http://127.0.0.1:{daemon.port}/mcp"
        alice = {**HEADERS, "authorization": f"Bearer {token('alice', namespace)}"}
        bob = {**HEADERS, "authorization": f"Bearer {token('bob', namespace)}"}
        first, second = await open_session(http, url, alice), await open_session(http, url, alice)
        bobs = [await open_session(http, url, bob) for _ in range(2)]
        assert (await http.post(url, json=LIST, headers={**alice, "mcp-session-id": first})).status_code == 200
        third = await open_session(http, url, alice)  # `second` is now the one idle the longest

        async def status(headers: dict[str, str], session_id: str) -> int:
            return (await http.post(url, json=LIST, headers={**headers, "mcp-session-id": session_id})).status_code

        assert [await status(alice, sid) for sid in (first, second, third)] == [200, 404, 200]
        assert [await status(bob, sid) for sid in bobs] == [200, 200], "another agent keeps its sessions"
        other_ns = {**HEADERS, "authorization": f"Bearer {token('alice', namespace + 'x')}"}
        assert await open_session(http, url, other_ns), "the same agent id in another namespace counts apart"
        async with http.stream("GET", url, headers={**alice, "accept": "text/event-stream", "mcp-session-id": first}), \
                http.stream("GET", url, headers={**alice, "accept": "text/event-stream", "mcp-session-id": third}):
            await anyio.sleep(0.2)  # both of alice's sessions now have an event stream open: none is idle
            refused = await http.post(url, json=INIT, headers=alice)
        assert refused.status_code == 503
        assert refused.json()["error"] == {
            "code": -32009, "data": {"reason": "too_many_mcp_sessions", "limit": 2},
            "message": "too many MCP sessions: agent 'alice' has 2 open, each with a request in flight "
                       "(MEMENTO_MCP_MAX_SESSIONS); end one (HTTP DELETE) or wait for one to go idle"}
        assert [await status(alice, sid) for sid in (first, third)] == [200, 200], "a refusal closes nothing"
        assert (await http.delete(url, headers={**alice, "mcp-session-id": first})).status_code == 200
        fourth = await open_session(http, url, alice)  # the DELETE made room: nothing else is closed
        assert [await status(alice, sid) for sid in (third, fourth)] == [200, 200]


def limit_actions(action: str) -> float:
    return REGISTRY.get_sample_value("memento_mcp_session_limit_total", {"action": action}) or 0.0


async def test_idle_mcp_sessions_expire_and_stop_counting_against_the_limit(settings: Settings,
                                                                            namespace: str) -> None:
    one = settings.model_copy(update={"mcp_max_sessions": 1, "port": 8765})
    alice = {**HEADERS, "authorization": f"Bearer {token('alice', namespace)}", "host": "127.0.0.1:8765"}
    async with serve_mcp(one, Registry(), idle_timeout=0.5) as app, \
            httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1:8765") as http:
        closed = limit_actions("closed")
        first = await open_session(http, "/mcp", alice)
        assert (await http.post("/mcp", json=LIST, headers={**alice, "mcp-session-id": first})).status_code == 200
        await anyio.sleep(1.0)
        assert (await http.post("/mcp", json=LIST, headers={**alice, "mcp-session-id": first})).status_code == 404
        second = await open_session(http, "/mcp", alice)
        assert (await http.post("/mcp", json=LIST, headers={**alice, "mcp-session-id": second})).status_code == 200
        assert limit_actions("closed") == closed, "the expired session made room: nothing was closed for it"


async def emit_many(ws: RpcSocket, sid: str, count: int, event: Callable[[int], dict[str, Any]]) -> None:
    """`count` events `event(0)`.. into `sid`, in batches of 500."""
    for start in range(0, count, 500):
        batch = [event(n) for n in range(start, min(start + 500, count))]
        await ws.call("event.emitBatch", {"sessionId": sid, "events": batch})


async def test_get_session_reads_2500_events_in_three_pages_following_next_since(connect: Connect, daemon: Daemon,
                                                                                namespace: str) -> None:
    async with connect(token("reader", namespace)) as mcp, rpc(daemon.port, token("writer", namespace)) as ws:
        sid = (await ws.call("session.create", {}))["sessionId"]
        await emit_many(ws, sid, 2500, lambda n: {"type": "modified", "data": {"n": n}})
        pages, since = [], 0
        while True:
            page = ok(await mcp.call_tool("get_session", {"sessionId": sid, "since": since}))
            assert steady(page) == steady(await ws.call("session.get", {"sessionId": sid, "since": since}))
            pages.append(page)
            if "nextSince" not in page:
                break
            since = page["nextSince"]
        assert [len(page["events"]) for page in pages] == [1000, 1000, 500]
        assert [page.get("nextSince") for page in pages] == [1000, 2000, None]
        seen = [event["seq"] for page in pages for event in page["events"]]
        assert seen == list(range(1, 2501)), "every event once, in order"
        assert [event["data"]["n"] for event in pages[2]["events"]][-1] == 2499
        short = ok(await mcp.call_tool("get_session", {"sessionId": sid, "since": 2400, "limit": 60}))
        assert [short["events"][0]["seq"], short["events"][-1]["seq"], short["nextSince"]] == [2401, 2460, 2460]


async def test_list_sessions_pages_with_cursor_and_next_cursor(connect: Connect, daemon: Daemon,
                                                               namespace: str) -> None:
    async with connect(token("lister", namespace)) as mcp, rpc(daemon.port, token("maker", namespace)) as ws:
        made = []
        for _ in range(3):
            made.append((await ws.call("session.create", {}))["sessionId"])
            await anyio.sleep(0.002)  # distinct creation times: newest first is then this order reversed
        first = ok(await mcp.call_tool("list_sessions", {"limit": 2}))
        assert steady(first) == steady(await ws.call("session.list", {"limit": 2}))
        assert [s["sessionId"] for s in first["sessions"]] == made[::-1][:2] and first["nextCursor"]
        rest = ok(await mcp.call_tool("list_sessions", {"limit": 2, "cursor": first["nextCursor"]}))
        assert steady(rest) == steady(await ws.call("session.list", {"limit": 2, "cursor": first["nextCursor"]}))
        assert [s["sessionId"] for s in rest["sessions"]] == [made[0]] and "nextCursor" not in rest
        text = failed(await mcp.call_tool("list_sessions", {"cursor": "not a cursor"}))
        assert text == ("Error executing tool list_sessions: invalid params (-32602); cursor: String should match "
                        "pattern '^[0-9]{1,16}:[A-Za-z0-9._:-]{1,128}$'")


async def test_isolate_session_pages_the_agents_events(connect: Connect, daemon: Daemon, namespace: str) -> None:
    async with connect(token("judge", namespace)) as mcp, rpc(daemon.port, token("worker", namespace)) as ws:
        sid = (await ws.call("session.create", {"entityIds": ["fn:w"]}))["sessionId"]
        await emit_many(ws, sid, 4, lambda n: {"type": "modified", "impact": {"perfDelta": 1.0}})
        args = {"sessionId": sid, "agentId": "worker", "limit": 3}
        first = ok(await mcp.call_tool("isolate_session", args))
        assert steady(first) == steady(await ws.call("bridge.isolate", args))
        assert [e["seq"] for e in first["events"]] == [1, 2, 3] and first["nextSince"] == 3
        assert first["totalPerfDelta"] == 4.0, "the total covers every event, not the page"
        rest = ok(await mcp.call_tool("isolate_session", {**args, "since": 3}))
        assert [e["seq"] for e in rest["events"]] == [4, 5] and "nextSince" not in rest


Schema = dict[str, Any]
# Declared keys no call below can provoke, each for a stated reason; every other declared key must be seen.
UNSEEN = {
    "checkpoint_session.snapshotPending",  # only while Postgres does not answer within 2 s
    "get_session.session.parentSessionId", "get_session.session.forkedAtSeq",  # no method forks a session yet
    "list_sessions.sessions[].parentSessionId", "list_sessions.sessions[].forkedAtSeq",
    "get_transitions.transitions[].checkpointId",  # an expired session whose events no snapshot kept
    # a compacted session and one created with onIdle: tests/test_compaction.py, tests/test_lifecycle.py
    "get_session.session.compactedSeq", "get_session.session.onIdle",
    "list_sessions.sessions[].compactedSeq", "list_sessions.sessions[].onIdle",
}


def branch(schema: Schema, value: Any, defs: Schema) -> Schema:
    """`schema` with its $ref resolved, and of an anyOf the branch for `value` (outputs only add null)."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in schema:
        options = [option for option in schema["anyOf"] if (option.get("type") == "null") == (value is None)]
        return branch(options[0], value, defs)
    return schema


def check_shape(schema: Schema, value: Any, defs: Schema, path: str, seen: set[str]) -> None:
    """Fail on a key `schema` does not declare or a required key `value` lacks; add each key seen to `seen`."""
    schema = branch(schema, value, defs)
    if isinstance(value, dict) and "properties" in schema:
        declared, required = set(schema["properties"]), set(schema.get("required", []))
        assert set(value) <= declared, f"{path}: undeclared {sorted(set(value) - declared)}"
        assert required <= set(value), f"{path}: missing required {sorted(required - set(value))}"
        for key, item in value.items():
            seen.add(f"{path}.{key}")
            check_shape(schema["properties"][key], item, defs, f"{path}.{key}", seen)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            check_shape(schema["items"], item, defs, f"{path}[]", seen)


def declared_keys(schema: Schema, defs: Schema, path: str) -> set[str]:
    """Every key path an output schema declares, nested objects and list items included."""
    if "$ref" in schema or "anyOf" in schema:
        options = [schema] if "$ref" in schema else schema["anyOf"]
        return set().union(*(declared_keys(branch(o, {}, defs) if "$ref" in o else o, defs, path) for o in options))
    keys = set()
    for key, item in schema.get("properties", {}).items():
        keys |= {f"{path}.{key}"} | declared_keys(item, defs, f"{path}.{key}")
    if "items" in schema:
        keys |= declared_keys(schema["items"], defs, f"{path}[]")
    return keys


SHAPE_NODES = [{"id": "cluster:shape", "labels": ["SemanticCluster"], "props": {"name": "Shapes"}},
               {"id": "spec:shape", "labels": ["Spec"], "props": {"title": "Shape spec"}},
               {"id": "fn:shape", "labels": ["CodebaseEntity"], "props": {"name": "shape"}}]
SHAPE_EDGES = [{"from": "fn:shape", "to": "cluster:shape", "type": "MEMBER_OF_CLUSTER"},
               {"from": "cluster:shape", "to": "spec:shape", "type": "IMPLEMENTS_CLUSTER"}]


async def test_every_tool_output_declares_exactly_the_keys_its_method_returns(daemon: Daemon, namespace: str) -> None:
    """Each tool's structured content is checked against its outputSchema, in every variant of its reply
    (a page with and without nextSince, condensed with truncated, a broken checkpoint's snapshotId, ...);
    then every key the schemas declare must have been seen, but for UNSEEN."""
    seen: set[str] = set()
    async with over_http(daemon.port, token("shaper", namespace)) as mcp, \
            rpc(daemon.port, token("helper", namespace, "sessions:read sessions:write kg:write")) as ws:
        schemas = {tool.name: tool.output_schema for tool in (await mcp.list_tools()).tools}

        async def both(tool: str, args: dict[str, Any], method: str | None = None) -> dict[str, Any]:
            """The tool's reply, shape-checked; with `method`, equal to the WebSocket reply key for key."""
            reply = ok(await mcp.call_tool(tool, args))
            schema = schemas[tool]
            assert schema is not None
            check_shape(schema, reply, schema.get("$defs", {}), tool, seen)
            if method is not None:
                assert steady(reply) == steady(await ws.call(method, args)), tool
            return reply

        await ws.call("kg.upsert", {"nodes": SHAPE_NODES, "edges": SHAPE_EDGES})
        sid = (await both("create_session", {"entityIds": ["fn:shape"], "labels": {"k": "v"}}))["sessionId"]
        await ws.call("session.join", {"sessionId": sid})
        await both("join_session", {"sessionId": sid})
        shape = {"changeInfo": {"entityIds": ["fn:shape"]}, "impact": {"perfDelta": 2.0}}
        await both("emit_event", {"sessionId": sid, "event": {"type": "modified", **shape}})
        await both("emit_event", {"sessionId": sid, "event": {"type": "broke", **shape}})
        await both("get_transitions", {"sessionId": sid}, "bridge.transitions")
        await both("isolate_session", {"sessionId": sid, "agentId": "shaper", "limit": 1}, "bridge.isolate")
        await both("isolate_session", {"sessionId": sid, "agentId": "shaper"}, "bridge.isolate")
        await both("get_handoff_context", {"sessionId": sid}, "bridge.handoff")
        assert "snapshotId" in await both("checkpoint_session", {"sessionId": sid})
        await both("session_outcomes", {"clusterId": "cluster:shape"}, "bridge.outcomes")
        await both("get_session", {"sessionId": sid, "limit": 1}, "session.get")  # lastCheckpoint now set
        said = (await ws.call("session.create", {}))["sessionId"]  # an agent's conversation: two blocks, two pages
        await emit_many(ws, said, 2, lambda n: {"type": "block:upsert", "data": {"block": {"id": f"b{n}"}}})
        assert "nextCursor" in await both("get_conversation", {"sessionId": said, "limit": 1}, "session.conversation")
        await both("get_conversation", {"sessionId": said, "cursor": 1}, "session.conversation")

        wide = (await ws.call("session.create", {}))["sessionId"]  # 1,001 entities: the condensed view cuts
        await emit_many(ws, wide, 1001, lambda n: {"type": "modified", "changeInfo": {"entityIds": [f"fn:w{n}"]}})
        assert "nextSince" in await both("get_session", {"sessionId": wide}, "session.get")
        assert "nextSince" not in await both("get_session", {"sessionId": wide, "since": 1000}, "session.get")
        condensed = await both("get_session", {"sessionId": wide, "condensed": True}, "session.get")
        assert condensed["truncated"] == ["entities"]
        assert "nextCursor" in await both("list_sessions", {"limit": 1}, "session.list")
        await both("list_sessions", {}, "session.list")
        runs = (await ws.call("session.create", {}))["sessionId"]  # two runs: their usage in two pages
        await emit_many(ws, runs, 2, lambda n: {"type": "query:started"})
        assert "nextCursor" in await both("usage", {"sessionId": runs, "limit": 1}, "usage.get")
        await both("usage", {"agentId": "helper"}, "usage.get")
        await both("usage", {}, "usage.get")

    declared = set().union(*(declared_keys(schema, schema.get("$defs", {}), tool) for tool, schema in schemas.items()
                            if schema is not None and tool not in COORDINATION | LIFECYCLE))
    notices = {key for key in declared if key.endswith(".notices")}  # every tool's: tests/test_notices.py
    assert declared - seen == UNSEEN | notices, "a key declared but never returned, or an UNSEEN key now seen"


def constraints(schema: Schema) -> dict[str, Any]:
    """The bounds and pattern of one property's JSON schema (of its non-null branch)."""
    schema = next((o for o in schema.get("anyOf", []) if o.get("type") != "null"), schema)
    return {key: schema[key] for key in ("minimum", "maximum", "pattern") if key in schema}


@pytest.mark.parametrize(("tool", "model", "names"), [
    ("get_session", GetParams, ["since", "limit"]), ("list_sessions", ListParams, ["limit", "cursor"]),
    ("isolate_session", IsolateParams, ["since", "limit"])])
async def test_paging_arguments_take_their_bounds_from_the_methods_params(tool: str, model: type[Any],
                                                                         names: list[str]) -> None:
    tools = {t.name: t for t in await build_server(Registry()).list_tools()}
    params = model.model_json_schema()["properties"]
    for name in names:
        mine = constraints(tools[tool].input_schema["properties"][name])
        assert mine and mine == constraints(params[name]), (tool, name)
