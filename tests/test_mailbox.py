"""Mailboxes: to an agent, a role or a session; kept for the absent, pushed once to the connected."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from memento_sessions import keys
from memento_sessions.auth import issue_token
from memento_sessions.backends import Backends
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import SECRET, make_settings, token
from tests.rpcsocket import rpc
from tests.test_leases import two_daemons

pytestmark = pytest.mark.anyio


async def test_a_message_to_an_absent_agent_waits_in_its_mailbox(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("b", namespace)):
        pass  # b has been seen in the namespace, and is gone
    async with rpc(daemon.port, token("a", namespace)) as a:
        sent = await a.call("mailbox.send", {"to": "b", "subject": "hi", "body": {"n": 1}, "id": "m1"})
        assert sent == {"messageId": "m1", "recipients": ["b"]}
    async with rpc(daemon.port, token("b", namespace)) as b:
        inbox = (await b.call("mailbox.read", {}))["messages"]
        assert [(m["seq"], m["messageId"], m["from"], m["subject"], m["body"], m["read"]) for m in inbox] == [
            (1, "m1", "a", "hi", {"n": 1}, False)]
        assert await b.call("mailbox.ack", {"messageIds": ["m1", "unknown"]}) == {"acked": 1}
        assert (await b.call("mailbox.read", {"unreadOnly": True}))["messages"] == []
        assert (await b.call("mailbox.read", {}))["messages"][0]["read"] is True


async def test_a_connected_agent_on_another_daemon_gets_it_live_once(backend_urls: Endpoints, tmp_path: Path,
                                                                     namespace: str) -> None:
    async with two_daemons(backend_urls, tmp_path) as (d1, d2), rpc(d1.port, token("a", namespace)) as a, \
            rpc(d2.port, token("b", namespace)) as b:
        await a.call("mailbox.send", {"to": "b", "body": "ping", "id": "m1"})
        again = await a.call("mailbox.send", {"to": "b", "body": "ping", "id": "m1"})
        assert again == {"messageId": "m1", "recipients": ["b"]}
        pushed = await b.notification("mailbox.message", timeout=2)
        assert pushed["params"]["messageId"] == "m1" and pushed["params"]["body"] == "ping"
        with pytest.raises(TimeoutError):
            await b.notification("mailbox.message", timeout=0.5)  # the resend was not delivered twice
        assert len((await b.call("mailbox.read", {}))["messages"]) == 1


async def test_an_agent_that_never_sent_anything_gets_its_messages_live(backend_urls: Endpoints, tmp_path: Path,
                                                                      namespace: str) -> None:
    async with two_daemons(backend_urls, tmp_path) as (d1, d2), rpc(d2.port, token("b", namespace)) as b, \
            rpc(d1.port, token("a", namespace)) as a:
        await a.call("mailbox.send", {"to": "b", "body": "first", "id": "m1"})  # b has sent nothing at all
        pushed = await b.notification("mailbox.message", timeout=2)
        assert pushed["params"]["messageId"] == "m1" and pushed["params"]["body"] == "first"


async def test_a_role_in_the_token_reaches_its_agent_live_and_only_it(daemon: Daemon, namespace: str) -> None:
    reviewer = issue_token(SECRET, "rev", namespace, roles=("reviewer",))
    async with rpc(daemon.port, reviewer) as rev, rpc(daemon.port, token("other", namespace)) as other, \
            rpc(daemon.port, token("a", namespace)) as a:
        sent = await a.call("mailbox.send", {"to": "role:reviewer", "body": "look", "id": "r1"})
        assert sent == {"messageId": "r1", "recipients": ["rev"]}  # neither has sent a request before this
        assert (await rev.notification("mailbox.message", timeout=2))["params"]["messageId"] == "r1"
        with pytest.raises(TimeoutError):
            await other.notification("mailbox.message", timeout=0.3)
        # presence.set adds declared roles to the token's; declaring others does not drop the token's
        declared = await rev.call("presence.set", {"roles": ["tests"]})
        assert declared == {"agentId": "rev", "roles": ["reviewer", "tests"]}
        await rev.call("presence.set", {"roles": []})
        assert (await a.call("mailbox.send", {"to": "role:reviewer", "body": 2}))["recipients"] == ["rev"]
        assert (await a.call("mailbox.send", {"to": "role:tests", "body": 3}))["recipients"] == []


@pytest.mark.parametrize(("roles", "reason"), [
    ("reviewer", "invalid token roles: must be a list of role names"),
    (["no spaces"], "invalid token roles: 'no spaces' is not 1..64 chars of [A-Za-z0-9._-]"),
    ([7], "invalid token roles: 7 is not 1..64 chars of [A-Za-z0-9._-]"),
    ([f"r{i}" for i in range(17)], "invalid token roles: at most 16 roles"),
])
async def test_a_token_with_a_bad_roles_claim_is_refused_saying_why(daemon: Daemon, namespace: str, roles: Any,
                                                                     reason: str) -> None:
    claims = {"sub": "a", "ns": namespace, "scope": "sessions:read", "exp": int(time.time()) + 60, "roles": roles}
    assert await handshake(daemon.port, jwt.encode(claims, SECRET, algorithm="HS256")) == (401, {"error": reason})
    with pytest.raises(ValueError, match=r"'no spaces' is not 1\.\.64 chars"):
        issue_token(SECRET, "a", namespace, roles=("no spaces",))


async def handshake(port: int, bearer: str) -> tuple[int, Any]:
    """The HTTP status and JSON body of a refused WebSocket handshake (an accepted one fails the test)."""
    try:
        async with connect(f"ws://127.0.0.1:{port}/ws", additional_headers={"Authorization": f"Bearer {bearer}"}):
            pass
    except InvalidStatus as exc:
        return exc.response.status_code, json.loads(exc.response.body)
    raise AssertionError("the handshake was accepted")


async def test_roles_and_sessions_address_several_agents(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b, \
            rpc(daemon.port, token("c", namespace)) as c:
        await b.call("presence.set", {"roles": ["reviewer"]})
        await c.call("presence.set", {"roles": ["reviewer", "tests"]})
        assert (await a.call("mailbox.send", {"to": "role:reviewer", "body": 1}))["recipients"] == ["b", "c"]
        await c.call("presence.set", {"roles": ["tests"]})
        assert (await a.call("mailbox.send", {"to": "role:reviewer", "body": 2}))["recipients"] == ["b"]
        sid = (await a.call("session.create", {}))["sessionId"]
        await c.call("session.join", {"sessionId": sid})
        assert (await a.call("mailbox.send", {"to": f"session:{sid}", "body": 3}))["recipients"] == ["c"]
        error = await a.error("mailbox.send", {"to": "session:nope", "body": 4})
        assert error["code"] == -32004


async def test_the_cap_drops_the_oldest_and_reads_page(backend_urls: Endpoints, tmp_path: Path,
                                                       namespace: str) -> None:
    from prometheus_client import REGISTRY
    before = REGISTRY.get_sample_value("memento_mailbox_dropped_total") or 0.0
    async with running(make_settings(backend_urls, tmp_path, mailbox_max=10)) as d, \
            rpc(d.port, token("a", namespace)) as a:
        async with rpc(d.port, token("b", namespace)):
            pass  # seen, then gone
        for i in range(15):
            await a.call("mailbox.send", {"to": "b", "body": i})
        assert REGISTRY.get_sample_value("memento_mailbox_dropped_total") == before + 5
        async with rpc(d.port, token("b", namespace)) as b:
            first = await b.call("mailbox.read", {"limit": 4})
            assert [m["body"] for m in first["messages"]] == [5, 6, 7, 8] and first["nextSince"] == 9
            rest = await b.call("mailbox.read", {"since": first["nextSince"], "limit": 100})
            assert [m["body"] for m in rest["messages"]] == [9, 10, 11, 12, 13, 14] and "nextSince" not in rest
    async with running(make_settings(backend_urls, tmp_path / "2", mailbox_max=3)) as d, \
            rpc(d.port, token("a", namespace)) as a, rpc(d.port, token("b", namespace)) as b:
        await a.call("mailbox.send", {"to": "b", "body": 15})  # a lowered cap: the excess goes in one send
        assert REGISTRY.get_sample_value("memento_mailbox_dropped_total") == before + 5 + 8
        assert [m["body"] for m in (await b.call("mailbox.read", {}))["messages"]] == [13, 14, 15]


async def test_a_mailbox_lives_as_long_as_its_longest_message(daemon: Daemon, backends: Backends,
                                                              namespace: str) -> None:
    order, messages, acked = keys.mailbox_keys(namespace, "b")
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        await a.call("mailbox.send", {"to": "b", "body": 1, "ttl": 86400, "id": "long"})
        await a.call("mailbox.send", {"to": "b", "body": 2, "ttl": 60, "id": "short"})  # must not shorten it
        assert await b.call("mailbox.ack", {"messageIds": ["long"]}) == {"acked": 1}  # acked is made here
    day = time.time() + 86400
    for key in (order, messages, acked):
        assert day <= await backends.redis.expiretime(key) <= day + 60 + 5  # kept at most a minute longer
    await backends.redis.expire(messages, 100)
    async with rpc(daemon.port, token("a", namespace)) as a:  # a send past the keep-until pushes it out
        await a.call("mailbox.send", {"to": "b", "body": 3, "ttl": 2 * 86400, "id": "longer"})
    assert await backends.redis.ttl(messages) > 2 * 86400 - 5


@pytest.mark.parametrize(("params", "field"), [
    ({"to": "b", "body": "x" * 17000}, "body"),
    ({"to": "b c", "body": 1}, "to"),
    ({"to": "b", "body": 1, "ttl": 10}, "ttl"),
    ({"to": "b", "body": 1, "id": "bad id"}, "id"),
    ({"body": 1}, "to"),
])
async def test_bad_sends_are_refused_and_write_nothing(daemon: Daemon, namespace: str, params: dict[str, Any],
                                                       field: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        error = await a.error("mailbox.send", params)
        assert error["code"] == -32602 and field in [item["field"] for item in error["data"]]
        assert (await b.call("mailbox.read", {}))["messages"] == []
        assert (await a.error("mailbox.read", {"limit": 0}))["code"] == -32602
        assert (await a.error("mailbox.ack", {"messageIds": []}))["code"] == -32602


async def test_the_coordination_tools_return_their_methods_results_in_their_declared_shape(
        daemon: Daemon, namespace: str) -> None:
    """Every coordination tool over /mcp: its reply equals the WebSocket method's, matches its outputSchema, and
    every key the eight schemas declare is seen."""
    from memento_sessions.mcp.tools_coordination import NAMES
    from tests.test_mcp import check_shape, declared_keys, ok, over_http, steady

    seen: set[str] = set()
    async with over_http(daemon.port, token("m", namespace)) as mcp, rpc(daemon.port, token("w", namespace)) as ws:
        schemas = {tool.name: tool.output_schema for tool in (await mcp.list_tools()).tools if tool.name in NAMES}
        assert set(schemas) == NAMES

        async def both(tool: str, args: dict[str, Any], method: str | None = None) -> dict[str, Any]:
            reply = ok(await mcp.call_tool(tool, args))
            schema = schemas[tool]
            assert schema is not None
            check_shape(schema, reply, schema.get("$defs", {}), tool, seen)
            if method is not None:
                assert steady(reply) == steady(await ws.call(method, args)), tool
            return reply

        sid = (await ws.call("session.create", {}))["sessionId"]
        await ws.call("session.join", {"sessionId": sid})
        await both("who_is_here", {"sessionId": sid}, "presence.get")
        await ws.call("lease.acquire", {"entityIds": ["held"], "ttl": 60})
        assert not (await both("acquire_lease", {"entityIds": ["held"], "ttl": 60}))["granted"]
        lease = await both("acquire_lease", {"entityIds": ["mine"], "ttl": 60, "mode": "shared"})
        assert (await both("claim_task", {"taskId": "t1", "ttl": 60}))["granted"]
        await both("renew_lease", {"leaseId": lease["leaseId"], "ttl": 120})
        assert "nextCursor" in await both("list_leases", {"limit": 1}, "lease.list")
        await both("list_leases", {"agentId": "m"}, "lease.list")
        await both("release_lease", {"leaseId": lease["leaseId"]})
        await ws.call("mailbox.send", {"to": "m", "body": {"n": 1}})
        await ws.call("mailbox.send", {"to": "m", "body": {"n": 2}})
        sent = await both("send_message", {"to": "w", "body": "hello", "subject": "s"})
        assert sent["recipients"] == ["w"]
        assert [n["body"] for n in sent["notices"]] == [{"n": 1}, {"n": 2}]  # the two sends above, surfaced
        status = await both("message_status", {"messageId": sent["messageId"]})
        assert [receipt["agentId"] for receipt in status["recipients"]] == ["w"]
        assert "nextSince" in await both("read_inbox", {"limit": 1})
        inbox = await both("read_inbox", {})
        assert await both("ack_messages", {"messageIds": [m["messageId"] for m in inbox["messages"]]}) == {"acked": 2}
        error = await mcp.call_tool("acquire_lease", {"entityIds": [], "ttl": 60})
        assert error.is_error and "invalid params (-32602)" in str(error.content)
    declared = set().union(*(declared_keys(schema, schema.get("$defs", {}), tool) for tool, schema in schemas.items()
                            if schema is not None))
    assert declared - seen == {f"{tool}.notices" for tool in NAMES} - seen  # tests/test_notices.py has them
