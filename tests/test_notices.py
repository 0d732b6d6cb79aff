"""Notices on MCP tool results: clients drop MCP notifications, so what is new for the caller (messages,
conflict alerts on what it leases) rides on its next tool result, once, with the receipt marked surfaced."""

from __future__ import annotations

import pytest

from memento_sessions.client import Client
from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import rpc
from tests.test_mcp import ok, over_http

pytestmark = pytest.mark.anyio


async def test_a_message_rides_on_the_next_tool_result_once(daemon: Daemon, namespace: str) -> None:
    async with over_http(daemon.port, token("worker", namespace)) as mcp, \
            rpc(daemon.port, token("boss", namespace)) as boss:
        assert "notices" not in ok(await mcp.call_tool("list_leases", {}))  # nothing yet (and worker is seen)
        sent = await boss.call("mailbox.send", {"to": "worker", "subject": "plan", "body": {"next": "auth"}})
        first = ok(await mcp.call_tool("list_leases", {}))
        assert [(n["kind"], n["messageId"], n["from"], n["body"]) for n in first["notices"]] == [
            ("message", sent["messageId"], "boss", {"next": "auth"})]
        assert "notices" not in ok(await mcp.call_tool("list_leases", {}))  # surfaced once
        (receipt,) = (await boss.call("mailbox.status", {"messageId": sent["messageId"]}))["recipients"]
        assert receipt["agentId"] == "worker" and receipt["surfaced"] and receipt["acked"] is None
        await mcp.call_tool("ack_messages", {"messageIds": [sent["messageId"]]})
        (receipt,) = (await boss.call("mailbox.status", {"messageId": sent["messageId"]}))["recipients"]
        assert receipt["acked"] and receipt["acked"] >= receipt["surfaced"]


async def test_a_conflict_on_a_leased_file_is_a_notice(daemon: Daemon, namespace: str) -> None:
    async with over_http(daemon.port, token("holder", namespace)) as mcp, \
            rpc(daemon.port, token("intruder", namespace)) as intruder:
        lease = ok(await mcp.call_tool("acquire_lease", {"entityIds": ["file:src/auth.py"], "ttl": 60}))
        assert lease["granted"]
        sid = (await intruder.call("session.create", {}))["sessionId"]
        await intruder.call("event.emit", {"sessionId": sid, "event": {
            "type": "modified", "changeInfo": {"entityIds": ["file:src/auth.py"], "operation": "modified"}}})
        notices = ok(await mcp.call_tool("who_is_here", {"sessionId": sid}))["notices"]
        assert [(n["kind"], n["body"]["entityId"], n["body"]["by"]) for n in notices] == [
            ("conflict", "file:src/auth.py", "intruder")]


async def test_only_the_sender_reads_a_receipt(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        sent = await a.call("mailbox.send", {"to": "b", "body": "hi"})
        error = await b.error("mailbox.status", {"messageId": sent["messageId"]})
        assert error["code"] == -32004
        error = await a.error("mailbox.status", {"messageId": "not an id!"})
        assert error["code"] == -32602 and error["data"][0]["field"] == "messageId"
        pushed = await b.notification("mailbox.message")
        assert pushed["params"]["messageId"] == sent["messageId"]
        await b.call("mailbox.ack", {"messageIds": [sent["messageId"]]})
        receipt = await a.notification("mailbox.receipt")
        (status,) = (await a.call("mailbox.status", {"messageId": sent["messageId"]}))["recipients"]
    assert status["stored"] and status["pushed"] and status["acked"]
    assert receipt["params"]["messageId"] == sent["messageId"] and receipt["params"]["agentId"] == "b"


async def test_the_python_client_and_the_mcp_tool_read_a_receipt(daemon: Daemon, namespace: str) -> None:
    async with Client(f"ws://127.0.0.1:{daemon.port}/ws", token("a", namespace), reconnect=False) as client, \
            rpc(daemon.port, token("b", namespace)), over_http(daemon.port, token("a", namespace)) as mcp:
        sent = await client.call("mailbox.send", {"to": "b", "body": "hi"})
        status = await client.message_status(sent["messageId"])
        assert [r["agentId"] for r in status["recipients"]] == ["b"] and status["recipients"][0]["stored"]
        assert ok(await mcp.call_tool("message_status", {"messageId": sent["messageId"]}))["recipients"][0][
            "agentId"] == "b"
