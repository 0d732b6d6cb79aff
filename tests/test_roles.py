"""Roles: a role some token grants is the tokens' alone; presence.set declares only roles no token grants."""

from __future__ import annotations

import pytest

from memento_sessions.auth import issue_token
from memento_sessions.server.daemon import Daemon
from tests.helpers import SECRET, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


async def test_a_role_granted_by_tokens_cannot_be_claimed_without_it(daemon: Daemon, namespace: str) -> None:
    reviewer = issue_token(SECRET, "rev", namespace, roles=("reviewer",))
    async with rpc(daemon.port, token("mallory", namespace)) as mallory:
        # claimed before any token granting `ops` was seen: a declared role, until a token grants it
        assert (await mallory.call("presence.set", {"roles": ["ops"]}))["roles"] == ["ops"]
        async with rpc(daemon.port, reviewer) as rev, \
                rpc(daemon.port, issue_token(SECRET, "op1", namespace, roles=("ops",))):
            error = await mallory.error("presence.set", {"roles": ["tests", "reviewer"]})
            assert error["code"] == -32001
            assert error["data"] == [{"field": "roles.1", "message": "'reviewer' is granted by tokens and this "
                                      "token does not grant it"}]
            sent = await mallory.call("mailbox.send", {"to": "role:reviewer", "body": "approve mine"})
            assert sent["recipients"] == ["rev"]
            assert (await mallory.call("mailbox.send", {"to": "role:ops", "body": 1}))["recipients"] == ["op1"]
            assert (await mallory.call("mailbox.send", {"to": "role:tests", "body": 2}))["recipients"] == []
            # a declared role no token grants still works, and the token's holder may declare it too
            assert (await mallory.call("presence.set", {"roles": ["tests"]}))["roles"] == ["tests"]
            assert (await rev.call("presence.set", {"roles": ["reviewer", "tests"]}))["roles"] == ["reviewer",
                                                                                                 "tests"]
            assert (await mallory.call("mailbox.send", {"to": "role:tests", "body": 3}))["recipients"] == ["rev"]
            assert (await rev.call("mailbox.send", {"to": "role:tests", "body": 4}))["recipients"] == ["mallory"]
