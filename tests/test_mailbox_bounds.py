"""Mailbox bounds: a send's body is stored once however many it reaches, a namespace has at most
MEMENTO_MAILBOXES_MAX mailboxes, a send to an agent never seen is refused, and a message id is its sender's."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from memento_sessions import keys
from memento_sessions.backends import Backends
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio
MEMBERS = 1000


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("memento_mailbox_refused_total", {"reason": reason}) or 0.0


async def stored_bytes(backends: Backends, namespace: str) -> int:
    """Bytes of every key of the namespace, as Redis counts them."""
    return sum([await backends.redis.memory_usage(key) or 0
                async for key in backends.redis.scan_iter(match=f"*:{namespace}:*", count=1000)])


async def test_a_send_to_a_1000_member_role_stores_its_body_once(daemon: Daemon, backends: Backends,
                                                                 namespace: str) -> None:
    members = [f"m{i:04d}" for i in range(MEMBERS)]
    await backends.redis.sadd(keys.declared_members(namespace, "crowd"), *members)  # as 1,000 presence.set calls would
    body = {"text": "x" * 16_000}
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("m0001", namespace)) as live:
        sent = await a.call("mailbox.send", {"to": "role:crowd", "subject": "all", "body": body, "id": "big"})
        assert sent["recipients"] == members
        pushed = await live.notification("mailbox.message", timeout=5)
        assert pushed["params"]["body"] == body and pushed["params"]["subject"] == "all"  # the push carries it
    total = await stored_bytes(backends, namespace)
    print(f"role send to {MEMBERS}: {total} B in the namespace's keys, its role set included")
    assert total < 2 * 16_000 + MEMBERS * 1024  # a reference (and the role's member) each: a copy each is 16 MB
    body_bytes = await backends.redis.memory_usage(keys.mail_body(namespace, "big")) or 0
    assert 16_000 <= body_bytes < 2 * 16_000  # of which the one body
    async with rpc(daemon.port, token("m0999", namespace)) as last:
        [message] = (await last.call("mailbox.read", {}))["messages"]
        assert (message["messageId"], message["from"], message["to"], message["subject"], message["body"]) == (
            "big", "a", "role:crowd", "all", body)


async def test_a_namespace_has_at_most_mailboxes_max_mailboxes(backend_urls: Endpoints, tmp_path: Path,
                                                               backends: Backends, namespace: str) -> None:
    before = refused("mailbox_limit")
    async with running(make_settings(backend_urls, tmp_path, mailboxes_max=3)) as d:
        for agent in "bcde":
            async with rpc(d.port, token(agent, namespace)):
                pass  # each agent has been seen
        async with rpc(d.port, token("a", namespace)) as a:
            for agent in "bcd":
                assert (await a.call("mailbox.send", {"to": agent, "body": 1}))["recipients"] == [agent]
            error = await a.error("mailbox.send", {"to": "e", "body": 2})
            assert error["code"] == -32009 and error["data"]["reason"] == "mailbox_limit"
            assert "MEMENTO_MAILBOXES_MAX" in error["message"]
            assert await a.call("mailbox.send", {"to": "b", "body": 3})  # an existing mailbox takes more
        assert not await backends.redis.exists(*keys.mailbox_keys(namespace, "e"))  # the refused send wrote nothing
        assert await backends.redis.zcard(keys.mail_keys(namespace)[0]) == 3
    assert refused("mailbox_limit") == before + 1


async def test_a_send_to_an_agent_never_seen_is_refused_unless_the_operator_allows_it(
        backend_urls: Endpoints, tmp_path: Path, backends: Backends, namespace: str) -> None:
    before = refused("unknown_agent")
    async with running(make_settings(backend_urls, tmp_path)) as d, rpc(d.port, token("a", namespace)) as a:
        for i in range(200):
            error = await a.error("mailbox.send", {"to": f"ghost-{i}", "body": i})
            assert error["code"] == -32602 and error["data"][0]["field"] == "to"
            assert f"no agent 'ghost-{i}' has been seen" in error["data"][0]["message"]
        made = [key async for key in backends.redis.scan_iter(match=f"*{namespace}*ghost*", count=1000)]
        assert made == []  # 200 sends to made-up agents: no key (it was two per send)
        assert refused("unknown_agent") == before + 200
        assert (await a.call("mailbox.send", {"to": "a", "body": "note to self"}))["recipients"] == ["a"]
    async with running(make_settings(backend_urls, tmp_path / "open", mailbox_unknown_agents=True)) as d, \
            rpc(d.port, token("a", namespace)) as a:
        assert (await a.call("mailbox.send", {"to": "ghost-0", "body": 0}))["recipients"] == ["ghost-0"]


async def test_a_message_id_another_sender_used_is_refused_not_reported_sent(daemon: Daemon, backends: Backends,
                                                                             namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b, \
            rpc(daemon.port, token("c", namespace)) as c:
        assert (await a.call("mailbox.send", {"to": "c", "body": "from a", "id": "m1"}))["recipients"] == ["c"]
        error = await b.error("mailbox.send", {"to": "c", "body": "from b", "id": "m1"})
        assert error["code"] == -32009 and error["data"] == {"reason": "id_taken", "messageId": "m1"}
        again = {"to": "c", "body": "from a", "id": "m1", "ttl": 2 * 86400}  # a retry with a longer ttl
        assert (await a.call("mailbox.send", again))["recipients"] == ["c"]
        assert await backends.redis.ttl(keys.mail_body(namespace, "m1")) > 2 * 86400 - 5  # the body lasts as long
        inbox = (await c.call("mailbox.read", {}))["messages"]
        assert [(m["messageId"], m["from"], m["body"]) for m in inbox] == [("m1", "a", "from a")]
