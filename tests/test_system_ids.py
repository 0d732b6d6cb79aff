"""The daemon's own ids and event types are out of clients' reach: no agent can pre-empt its own conflict alert,
forge a `conflict` record, or take over a message id another sender used."""

from __future__ import annotations

from typing import Any

import pytest

from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


def edit(event_id: str | None = None, entity: str = "e1", kind: str = "modified") -> dict[str, Any]:
    event: dict[str, Any] = {"type": kind, "changeInfo": {"entityIds": [entity], "operation": "modified"}}
    return {**event, "id": event_id} if event_id else event


async def test_an_agent_cannot_suppress_its_own_conflict_alert(daemon: Daemon, namespace: str) -> None:
    """b knows the ids its conflicting emit (seq 2) will raise and tries to use them first: each is refused
    naming the field, and the emit still alerts the holder, in its mailbox and in the session."""
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        lease = await a.call("lease.acquire", {"entityIds": ["e1"], "ttl": 60})
        sid = (await b.call("session.create", {}))["sessionId"]
        await b.call("event.emit", {"sessionId": sid, "event": {"type": "note"}})  # seq 1
        alert_id = f"conflict:{sid}:2:{lease['leaseId']}"
        attempts = [
            ("mailbox.send", {"to": "a", "body": "decoy", "id": alert_id}, "id"),
            ("event.emit", {"sessionId": sid, "event": {"id": "conflict-2", "type": "note"}}, "event.id"),
            ("event.emit", {"sessionId": sid, "event": {"id": "conflict:x", "type": "note"}}, "event.id"),
            ("event.emitBatch", {"sessionId": sid, "events": [{"type": "note"}, {"id": "conflict-3", "type": "x"}]},
             "events.1.id"),
            ("event.emit", {"sessionId": sid, "event": {"type": "conflict", "data": {"conflicts": "forged"}}},
             "event.type"),
            ("event.emitBatch", {"sessionId": sid, "events": [{"type": "conflict"}]}, "events.0.type"),
        ]
        for method, params, field in attempts:
            error = await b.error(method, params)
            assert error["code"] == -32602 and field in [item["field"] for item in error["data"]], (method, error)
            assert "the daemon's own" in error["data"][0]["message"]
        assert (await a.call("mailbox.read", {}))["messages"] == []  # nothing of the decoys was stored
        emitted = await b.call("event.emit", {"sessionId": sid, "event": edit()})
        assert emitted["seq"] == 2 and [c["leaseId"] for c in emitted["conflicts"]] == [lease["leaseId"]]
        inbox = (await a.call("mailbox.read", {}))["messages"]
        assert [(m["messageId"], m["subject"], m["body"]["seq"]) for m in inbox] == [(alert_id, "lease.conflict", 2)]
        events = (await b.call("session.get", {"sessionId": sid}))["events"]
        assert [(e["seq"], e["type"], e.get("id")) for e in events] == [
            (1, "note", None), (2, "modified", None), (3, "conflict", "conflict-2")]
