"""The Python client has a typed method for every declared method, and those methods work against a real daemon."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest

from memento_sessions.api.table import METHODS
from memento_sessions.client import Client
from memento_sessions.client import results as client_results
from memento_sessions.server.daemon import Daemon
from memento_sessions.sessions.models import SessionState
from tests.helpers import token

pytestmark = pytest.mark.anyio
CLIENT = Path(__file__).parent.parent / "memento_sessions" / "client"


def called_methods() -> set[str]:
    """Every JSON-RPC method name the client's code sends (`"session.get"` in a call)."""
    found: set[str] = set()
    for path in CLIENT.glob("*.py"):
        found |= set(re.findall(r'"([a-z]+\.[a-z][A-Za-z]+)"', path.read_text()))
    return found


def test_the_client_calls_every_declared_method() -> None:
    missing = [declared.name for declared in METHODS if declared.name not in called_methods()]
    assert missing == []


def test_the_client_methods_return_the_declared_results() -> None:
    by_name = {declared.name: declared.result for declared in METHODS}
    typed = {"create_session": "session.create", "join": "session.join", "emit": "event.emit",
             "emit_batch": "event.emitBatch", "diff": "session.diff", "fork": "session.fork",
             "acquire_lease": "lease.acquire", "read_inbox": "mailbox.read", "discover": "rpc.discover",
             "conversation": "session.conversation", "handoff": "bridge.handoff", "kg_upsert": "kg.upsert",
             "commit": "bridge.commit", "message_status": "mailbox.status", "surface": "mailbox.surface",
             "hook_answer": "hook.answer"}
    for attribute, method in typed.items():
        hints = typing.get_type_hints(getattr(Client, attribute))
        assert hints["return"] is by_name[method], attribute
    assert list(inspect.signature(Client.create_session).parameters)[:2] == ["self", "entity_ids"]


def test_the_client_session_states_are_the_daemons() -> None:
    assert typing.get_args(client_results.SessionState) == typing.get_args(SessionState)


async def test_the_new_methods_against_a_daemon(daemon: Daemon, namespace: str) -> None:
    url = f"ws://127.0.0.1:{daemon.port}/ws"
    async with Client(url, token("cli-a", namespace)) as alice, Client(url, token("cli-b", namespace)) as bob:
        sid = (await alice.create_session(["fn:a"]))["sessionId"]
        await alice.emit(sid, {"type": "broke", "changeInfo": {"entityIds": ["fn:a"], "operation": "modified"}})
        assert (await alice.get_at(sid, 1))["session"]["state"] == "working"
        diff = await alice.diff(sid, 1, 2)
        assert diff["stateFrom"] == "working" and diff["stateTo"] == "broken" and diff["events"] == 1
        assert (await alice.snapshot(sid))["seq"] == 2
        forked = await alice.fork(sid, 1)
        assert forked["parentSessionId"] == sid and forked["forkedAtSeq"] == 1
        lease = await alice.acquire_lease(["fn:a"], 30, session_id=sid)
        assert lease["granted"] is True and lease["fencingToken"] is not None
        refused = await bob.acquire_lease(["fn:a"], 30)
        assert refused["granted"] is False and refused["conflicts"][0]["leaseId"] == lease["leaseId"]
        assert [item["leaseId"] for item in (await bob.list_leases(entity_id="fn:a"))["leases"]] == [lease["leaseId"]]
        assert lease["leaseId"] is not None
        assert (await alice.release_lease(lease["leaseId"]))["released"] is True
        sent = await alice.send_message("cli-b", {"note": "yours"}, subject="handoff", message_id="m-1")
        assert sent["recipients"] == ["cli-b"]
        inbox = await bob.read_inbox(unread_only=True)
        assert [message["messageId"] for message in inbox["messages"] if message["subject"] == "handoff"] == ["m-1"]
        assert (await bob.ack_messages(["m-1"]))["acked"] == 1
        status = await alice.message_status("m-1")
        assert [(item["agentId"], item["acked"] is not None) for item in status["recipients"]] == [("cli-b", True)]
        await alice.send_message("cli-b", {"note": "later"}, subject="later", message_id="m-2")
        surfaced = (await bob.surface())["notices"]
        assert [notice["messageId"] for notice in surfaced] == ["m-2"] and (await bob.surface())["notices"] == []
        sha = "ab" * 20
        stored = await alice.emit(sid, {"type": "commit", "data": {"sha": sha, "message": "fix a"}})
        found = await bob.commit(sha[:8])
        assert (found["sessionId"], found["seq"], found["agentId"]) == (sid, stored["seq"], "cli-a")
        assert (await alice.hook_answer({"hook_event_name": "NotAHook"}))["output"] == {}
        assert (await alice.set_roles(["reviewer"]))["roles"] == ["reviewer"]
        assert "cli-a" in {agent["agentId"] for agent in (await alice.presence(sid))["agents"]}
        document = await alice.discover()
        assert document["openrpc"] == "1.3.2" and len(document["methods"]) == len(METHODS)
