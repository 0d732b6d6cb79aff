"""Mailboxes (SPEC 12): to an agent, a role or a session; kept for the absent, pushed once to the connected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.conftest import make_settings, token
from tests.rpcsocket import rpc
from tests.test_leases import two_daemons

pytestmark = pytest.mark.anyio


async def test_a_message_to_an_absent_agent_waits_in_its_mailbox(daemon: Daemon, namespace: str) -> None:
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
        await b.call("mailbox.read", {})  # b's first request: its connection now receives pushes
        await a.call("mailbox.send", {"to": "b", "body": "ping", "id": "m1"})
        again = await a.call("mailbox.send", {"to": "b", "body": "ping", "id": "m1"})
        assert again == {"messageId": "m1", "recipients": ["b"]}
        pushed = await b.notification("mailbox.message", timeout=2)
        assert pushed["params"]["messageId"] == "m1" and pushed["params"]["body"] == "ping"
        with pytest.raises(TimeoutError):
            await b.notification("mailbox.message", timeout=0.5)  # the resend was not delivered twice
        assert len((await b.call("mailbox.read", {}))["messages"]) == 1


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
        for i in range(15):
            await a.call("mailbox.send", {"to": "b", "body": i})
        assert REGISTRY.get_sample_value("memento_mailbox_dropped_total") == before + 5
        async with rpc(d.port, token("b", namespace)) as b:
            first = await b.call("mailbox.read", {"limit": 4})
            assert [m["body"] for m in first["messages"]] == [5, 6, 7, 8] and first["nextSince"] == 9
            rest = await b.call("mailbox.read", {"since": first["nextSince"], "limit": 100})
            assert [m["body"] for m in rest["messages"]] == [9, 10, 11, 12, 13, 14] and "nextSince" not in rest


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
