"""The http hook's decision keeps its promises however little it reads: a token it took before is refused once
expired, an agent back after its SessionEnd is at work again at once, the warning names the holder's reason,
expiry and lease, and an edit of a file the agent holds renews its one lease."""

from __future__ import annotations

import json
import time

import anyio
import pytest

from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import rpc
from tests.test_hook_answers import AGENT_A, A, B, context, edit, hook, http_form, post

pytestmark = pytest.mark.anyio


async def leases_on(port: int, namespace: str, entity: str = "file:src/auth.py") -> list[dict[str, object]]:
    async with rpc(port, token("reader", namespace)) as reader:
        found: list[dict[str, object]] = (await reader.call("lease.list", {"entityId": entity}))["leases"]
    return found


async def test_a_token_taken_before_is_refused_once_it_has_expired(daemon: Daemon, namespace: str) -> None:
    issued = int(time.time())
    headers = {"Authorization": f"Bearer {token('claude', namespace, ttl=3)}"}
    body = json.dumps(hook(A, "Stop")).encode()
    status, _ = await anyio.to_thread.run_sync(post, daemon.port, body, headers)
    assert status == 200 and time.time() < issued + 3
    await anyio.sleep(issued + 3 - time.time() + 0.2)  # past its exp (whole seconds)
    status, reply = await anyio.to_thread.run_sync(post, daemon.port, body, headers)
    assert (status, json.loads(reply)) == (401, {"error": "token expired"})


async def test_an_agent_back_after_its_session_end_is_at_work_again_at_once(daemon: Daemon, namespace: str) -> None:
    ask = http_form(daemon, namespace)
    await ask(hook(A, "SessionStart", source="startup"), {})
    await ask(edit(A), {})
    assert await ask(hook(A, "SessionEnd", reason="clear"), {}) == {}
    assert AGENT_A not in context(await ask(hook(B, "SessionStart", source="startup"), {}))
    await ask(edit(A, path="/repo/src/other.py"), {})  # A goes on, no SessionStart: listed again at this call
    assert AGENT_A in context(await ask(hook(B, "SessionStart", source="resume"), {}))


async def test_the_warning_names_the_holder_its_reason_its_expiry_and_its_lease(daemon: Daemon,
                                                                               namespace: str) -> None:
    ask = http_form(daemon, namespace)
    assert await ask(edit(A), {}) == {}
    (lease,) = await leases_on(daemon.port, namespace)
    for policy in ("warn", "enforce"):
        said = (await ask(edit(B), {"MEMENTO_HOOK_LEASES": policy}))["hookSpecificOutput"]
        text = said["additionalContext"] if policy == "warn" else said["permissionDecisionReason"]
        assert f"{AGENT_A} holds file:src/auth.py for 'editing (Edit) since " in text
        assert f" until {lease['expiresAt']} (lease {lease['leaseId']}, exclusive). " in text
        assert f"send_message to {AGENT_A} " in text


async def test_an_edit_of_a_file_the_agent_holds_renews_its_one_lease(daemon: Daemon, namespace: str) -> None:
    ask = http_form(daemon, namespace)
    assert await ask(edit(A), {}) == {}
    (first,) = await leases_on(daemon.port, namespace)
    await anyio.sleep(1.1)  # expiresAt is to the millisecond: a renewal moves it
    assert await ask(edit(A), {}) == {}
    (renewed,) = await leases_on(daemon.port, namespace)
    assert renewed["leaseId"] == first["leaseId"] and str(renewed["expiresAt"]) > str(first["expiresAt"])
