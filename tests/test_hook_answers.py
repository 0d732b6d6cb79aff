"""Hooks that answer: two Claude Code sessions sharing one token and settings are two agents; an edit claims
its file, the other session is warned (or denied) naming the holder, a message reaches the holder's next
tool call once with its receipt marked surfaced, SessionEnd frees the file. Both forms: the command hook run
as Claude Code runs it (a process per input) and the http hook (a real POST to the daemon's port)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from websockets.asyncio.client import connect

from memento_sessions.backends import Backends
from memento_sessions.cli import hook as cli_hook
from memento_sessions.endpoints import Endpoints
from memento_sessions.ingest.claude_hooks import HOOK_EVENTS
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, sample, token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = pytest.mark.anyio
HOOK = [str(Path(sys.executable).with_name("memento-sessions")), "hook"]
A, B = "aaaa1111-0000-4000-8000-000000000001", "bbbb2222-0000-4000-8000-000000000002"
AGENT_A, AGENT_B = "claude:aaaa1111", "claude:bbbb2222"
Ask = Callable[[Any, dict[str, str]], Awaitable[dict[str, Any]]]


def command_form(daemon: Daemon, data_dir: Path, namespace: str) -> Ask:
    """The command hook: one process per input, its stdout parsed (empty: no output)."""
    async def ask(record: Any, env: dict[str, str]) -> dict[str, Any]:
        full = {**os.environ, "MEMENTO_DATA_DIR": str(data_dir), "MEMENTO_TOKEN": token("claude", namespace),
                "MEMENTO_URL": f"ws://127.0.0.1:{daemon.port}/ws", **env}
        stdin = record if isinstance(record, bytes) else json.dumps(record).encode()
        done = await anyio.to_thread.run_sync(lambda: subprocess.run(
            HOOK, input=stdin, env=full, capture_output=True, timeout=30, check=False))
        assert (done.returncode, done.stderr) == (0, b"")
        return json.loads(done.stdout) if done.stdout else {}
    return ask


def post(port: int, body: bytes, headers: dict[str, str], agent: str = "claude-code") -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/hooks/{agent}", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_form(daemon: Daemon, namespace: str) -> Ask:
    """The http hook: the input POSTed with the bearer token, as Claude Code sends it."""
    async def ask(record: Any, env: dict[str, str]) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token('claude', namespace)}"}
        if "MEMENTO_HOOK_LEASES" in env:
            headers["X-Memento-Hook-Leases"] = env["MEMENTO_HOOK_LEASES"]
        body = record if isinstance(record, bytes) else json.dumps(record).encode()
        status, reply = await anyio.to_thread.run_sync(post, daemon.port, body, headers)
        assert status == 200, reply
        answer: dict[str, Any] = json.loads(reply)
        return answer
    return ask


@pytest.fixture(params=["command", "http"])
def ask(request: pytest.FixtureRequest, daemon: Daemon, tmp_path: Path, namespace: str) -> Ask:
    if request.param == "command":
        return command_form(daemon, tmp_path / "agent", namespace)
    return http_form(daemon, namespace)


def hook(session: str, event: str, **fields: Any) -> dict[str, Any]:
    return {"session_id": session, "transcript_path": f"/tmp/{session}.jsonl", "cwd": "/repo",
            "hook_event_name": event, **fields}


def edit(session: str, event: str = "PreToolUse", path: str = "/repo/src/auth.py") -> dict[str, Any]:
    fields: dict[str, Any] = {"tool_name": "Edit", "tool_use_id": f"toolu_{session[:4]}_{event}",
                              "tool_input": {"file_path": path, "old_string": "a", "new_string": "b"}}
    if event == "PostToolUse":
        fields["tool_response"] = {"filePath": path, "success": True}
    return hook(session, event, **fields)


def context(answer: dict[str, Any]) -> str:
    text: str = answer["hookSpecificOutput"]["additionalContext"]
    return text


async def holders(port: int, namespace: str, entity: str = "file:src/auth.py") -> list[str]:
    async with rpc(port, token("reader", namespace)) as reader:
        leases = (await reader.call("lease.list", {"entityId": entity}))["leases"]
    return [lease["agentId"] for lease in leases]


async def test_two_sessions_of_one_token_claim_warn_deny_message_and_release(
        ask: Ask, daemon: Daemon, namespace: str) -> None:
    start_a = await ask(hook(A, "SessionStart", source="startup"), {})
    assert f"you are agent {AGENT_A}" in context(start_a)
    start_b = await ask(hook(B, "SessionStart", source="startup"), {})
    assert AGENT_A in context(start_b)  # B sees A at work
    assert start_b["hookSpecificOutput"]["hookEventName"] == "SessionStart"

    assert await ask(edit(A), {}) == {}  # A's edit is allowed and claims the file
    assert await holders(daemon.port, namespace) == [AGENT_A]

    warned = await ask(edit(B), {})  # warn (the default): allowed, told who holds it
    assert "permissionDecision" not in warned["hookSpecificOutput"]
    assert AGENT_A in context(warned) and "file:src/auth.py" in context(warned)
    denied = (await ask(edit(B), {"MEMENTO_HOOK_LEASES": "enforce"}))["hookSpecificOutput"]
    assert denied["permissionDecision"] == "deny" and AGENT_A in denied["permissionDecisionReason"]
    assert await holders(daemon.port, namespace) == [AGENT_A]  # B claimed nothing

    async with rpc(daemon.port, token("claude", namespace)) as sender:
        sent = await sender.call("mailbox.send", {"to": AGENT_A, "subject": "auth", "body": "I need login() too"})
        assert sent["recipients"] == [AGENT_A]
        first = await ask(edit(A, "PostToolUse"), {})
        assert context(first).count("I need login() too") == 1
        assert await ask(edit(A, "PostToolUse"), {}) == {}  # surfaced once: nothing new the next time
        status = await sender.call("mailbox.status", {"messageId": sent["messageId"]})
    (receipt,) = status["recipients"]
    assert receipt["agentId"] == AGENT_A
    assert receipt["stored"] and receipt["surfaced"] and receipt["stored"] <= receipt["surfaced"]
    assert receipt["acked"] is None

    assert await ask(hook(A, "SessionEnd", reason="logout"), {}) == {}
    assert await holders(daemon.port, namespace) == []
    assert await ask(edit(B), {"MEMENTO_HOOK_LEASES": "enforce"}) == {}  # allowed now, and claimed by B
    assert await holders(daemon.port, namespace) == [AGENT_B]


async def test_another_namespace_sees_nothing(ask: Ask, daemon: Daemon, namespace: str, tmp_path: Path) -> None:
    await ask(hook(A, "SessionStart", source="startup"), {})
    await ask(edit(A), {})
    other = "o" + namespace[1:]
    outsider = http_form(daemon, other)
    seen = context(await outsider(hook(B, "SessionStart", source="startup"), {}))
    assert AGENT_A not in seen, seen
    assert namespace not in seen, seen
    assert await outsider(edit(B), {"MEMENTO_HOOK_LEASES": "enforce"}) == {}  # its own file:src/auth.py
    assert await holders(daemon.port, other) == [AGENT_B]
    assert await holders(daemon.port, namespace) == [AGENT_A]


@pytest.mark.parametrize("body", [b"not json {", json.dumps(edit(A))[:40].encode(),
                                  json.dumps(hook(A, "NoSuchEvent")).encode(), b"[1, 2]"])
async def test_what_is_not_a_hook_input_is_allowed_and_writes_nothing(
        ask: Ask, daemon: Daemon, backends: Backends, namespace: str, body: bytes, request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    before = sample("memento_hook_answers_total", {"outcome": "malformed"}) + sample(
        "memento_hook_answers_total", {"outcome": "unknown_event"})
    assert await ask(body, {}) == {}
    written = [key async for key in backends.redis.scan_iter(match=f"*{namespace}*", count=1000)]
    assert written == []
    after = sample("memento_hook_answers_total", {"outcome": "malformed"}) + sample(
        "memento_hook_answers_total", {"outcome": "unknown_event"})
    # The daemon counts what reaches it: every http input; the command hook keeps such an input to itself, not
    # even spooled.
    if request.node.callspec.params["ask"] == "http":
        assert after - before == 1
    else:
        assert after == before and not (tmp_path / "agent" / "hook-spool" / "spool.jsonl").exists()


async def test_an_http_hook_without_a_valid_token_is_refused(daemon: Daemon, namespace: str) -> None:
    status, _ = await anyio.to_thread.run_sync(post, daemon.port, json.dumps(edit(A)).encode(),
                                               {"Authorization": "Bearer nope"})
    assert status == 401


def test_the_command_hook_takes_the_events_the_converter_knows() -> None:
    assert cli_hook.EVENTS == HOOK_EVENTS


async def test_a_session_acts_as_its_tokens_own_agent_and_no_other(
        ask: Ask, daemon: Daemon, namespace: str, tmp_path: Path) -> None:
    """The session's events, claims and mailbox are `<sub>:<session>`'s; another token naming the same Claude
    session id is another agent (`mallory:aaaa1111`): it cannot end A's claims nor pass A's lease."""
    await ask(edit(A), {})
    await ask(edit(A, "PostToolUse"), {})
    flushed = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [*HOOK, "--flush"], env={**os.environ, "MEMENTO_DATA_DIR": str(tmp_path / "agent"),
                                 "MEMENTO_TOKEN": token("claude", namespace),
                                 "MEMENTO_URL": f"ws://127.0.0.1:{daemon.port}/ws"},
        capture_output=True, timeout=30, check=False, input=b""))
    assert flushed.returncode == 0
    async with rpc(daemon.port, token("reader", namespace)) as reader:
        events = (await reader.call("session.get", {"sessionId": A}))["events"]
    assert {event["actor"] for event in events} == {AGENT_A}
    assert any(event["type"] == "modified" for event in events) and not any(e["type"] == "conflict" for e in events)

    headers = {"Authorization": f"Bearer {token('mallory', namespace)}", "X-Memento-Hook-Leases": "enforce"}
    status, reply = await anyio.to_thread.run_sync(post, daemon.port, json.dumps(hook(A, "SessionEnd")).encode(),
                                                   headers)
    assert (status, json.loads(reply)) == (200, {})
    assert await holders(daemon.port, namespace) == [AGENT_A]  # mallory:aaaa1111 ended nothing of A's
    status, reply = await anyio.to_thread.run_sync(post, daemon.port, json.dumps(edit(A)).encode(), headers)
    denied = json.loads(reply)["hookSpecificOutput"]
    assert denied["permissionDecision"] == "deny" and AGENT_A in denied["permissionDecisionReason"]

    async with rpc_as(daemon.port, token("mallory", namespace), A) as socket:
        lease = await socket.call("lease.acquire", {"entityIds": ["file:src/other.py"], "ttl": 60})
    assert await holders(daemon.port, namespace, "file:src/other.py") == ["mallory:aaaa1111"]
    assert lease["granted"]


@asynccontextmanager
async def rpc_as(port: int, bearer: str, session: str) -> AsyncIterator[RpcSocket]:
    """A /ws connection opened with `?session=`, as the command hook opens its own."""
    url = f"ws://127.0.0.1:{port}/ws?session={session}"
    async with connect(url, additional_headers={"Authorization": f"Bearer {bearer}"}) as ws:
        yield RpcSocket(ws)


async def test_the_context_is_bounded_and_says_what_was_left_out(ask: Ask, daemon: Daemon, namespace: str) -> None:
    await ask(hook(A, "SessionStart", source="startup"), {})
    async with rpc(daemon.port, token("claude", namespace)) as sender:
        for n in range(30):
            await sender.call("mailbox.send", {"to": AGENT_A, "body": f"note {n:02d} " + "x" * 1000})
    text = context(await ask(hook(A, "SessionStart", source="resume"), {}))
    shown = [line for line in text.splitlines() if line.startswith("- message")]
    (left,) = re.findall(r"^\((\d+) more item\(s\) left out", text, re.MULTILINE)
    assert len(text) <= 4000 and all(len(line) <= 300 for line in shown)
    assert len(shown) >= 5 and len(shown) + int(left) == 20  # MEMENTO_HOOK_NOTICES_MAX unread messages
    assert "note 00" in shown[0]  # oldest first


def bash(session: str, event: str, n: int, **fields: Any) -> dict[str, Any]:
    return hook(session, event, tool_name="Bash", tool_use_id=f"toolu_{session[:4]}_bash{n}",
                tool_input={"command": "pytest -q"}, **fields)


async def test_another_agent_breaking_then_fixing_what_you_lease_reaches_you_once(
        ask: Ask, daemon: Daemon, namespace: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def settle() -> None:  # the command form delivers within its call; --flush waits for the rest
        if request.node.callspec.params["ask"] == "command":
            env = {**os.environ, "MEMENTO_DATA_DIR": str(tmp_path / "agent"),
                   "MEMENTO_TOKEN": token("claude", namespace), "MEMENTO_URL": f"ws://127.0.0.1:{daemon.port}/ws"}
            done = await anyio.to_thread.run_sync(lambda: subprocess.run([*HOOK, "--flush"], env=env, input=b"",
                                                                         capture_output=True, timeout=30))
            assert done.returncode == 0

    await ask(hook(A, "SessionStart", source="startup"), {})
    await ask(hook(B, "SessionStart", source="startup"), {})
    await ask(edit(A), {})  # A claims src/auth.py
    await ask(edit(B), {})  # warned, allowed
    await ask(edit(B, "PostToolUse"), {})  # B changed it: a conflict alert for A
    await ask(bash(B, "PreToolUse", 1), {})
    await ask(bash(B, "PostToolUseFailure", 1, error="Exit code 1\n1 failed"), {})
    await settle()
    broke = context(await ask(hook(A, "UserPromptSubmit", prompt="go on"), {}))
    assert broke.count(f"{AGENT_B} broke the build (pytest -q)") == 1 and "file:src/auth.py" in broke
    assert "conflict" in broke
    await ask(bash(B, "PostToolUse", 2, tool_response={"stdout": "1 passed", "stderr": "", "exit_code": 0}), {})
    await settle()
    fixed = context(await ask(hook(A, "UserPromptSubmit", prompt="and now?"), {}))
    assert fixed.count(f"{AGENT_B} fixed the build (pytest -q)") == 1 and "broke the build" not in fixed
    assert await ask(hook(A, "UserPromptSubmit", prompt="again"), {}) == {}


async def test_an_agent_posting_hooks_faster_than_its_rate_is_told_to_wait(backend_urls: Endpoints, tmp_path: Path,
                                                                           namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path, ws_rate_limit=2.0)) as daemon:
        headers = {"Authorization": f"Bearer {token('claude', namespace)}"}
        body = json.dumps(hook(A, "Stop")).encode()
        statuses = [(await anyio.to_thread.run_sync(post, daemon.port, body, headers))[0] for _ in range(6)]
    assert statuses[:2] == [200, 200] and 429 in statuses[2:]  # a burst of 2, then 2 a second
