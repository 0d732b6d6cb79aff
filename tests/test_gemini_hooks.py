"""Gemini CLI's hooks, shaped as its hooks reference documents them, on the same answers: the command hook with
--gemini (Gemini CLI runs only command hooks) and POST /hooks/gemini-cli."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from memento_sessions.backends import Backends
from memento_sessions.ingest.gemini_hooks import call_id, to_claude
from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import rpc
from tests.test_hook_answers import holders, post

pytestmark = pytest.mark.anyio
HOOK = [str(Path(sys.executable).with_name("memento-sessions")), "hook", "--gemini"]
A, B = "9a8b7c6d-0000-4000-8000-00000000000a", "1f2e3d4c-0000-4000-8000-00000000000b"
AGENT_A, AGENT_B = "gemini:9a8b7c6d", "gemini:1f2e3d4c"
Ask = Callable[[Any, dict[str, str]], Awaitable[dict[str, Any]]]


@pytest.fixture(params=["command", "http"])
def ask(request: pytest.FixtureRequest, daemon: Daemon, tmp_path: Path, namespace: str) -> Ask:
    async def command(record: Any, env: dict[str, str]) -> dict[str, Any]:
        full = {**os.environ, "MEMENTO_DATA_DIR": str(tmp_path / "agent"), "MEMENTO_TOKEN": token("gemini", namespace),
                "MEMENTO_URL": f"ws://127.0.0.1:{daemon.port}/ws", **env}
        stdin = record if isinstance(record, bytes) else json.dumps(record).encode()
        done = await anyio.to_thread.run_sync(lambda: subprocess.run(
            HOOK, input=stdin, env=full, capture_output=True, timeout=30, check=False))
        assert (done.returncode, done.stderr) == (0, b"")
        answer: dict[str, Any] = json.loads(done.stdout)  # always a JSON object: Gemini shows any other text
        return answer

    async def http(record: Any, env: dict[str, str]) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token('gemini', namespace)}"}
        if "MEMENTO_HOOK_LEASES" in env:
            headers["X-Memento-Hook-Leases"] = env["MEMENTO_HOOK_LEASES"]
        body = record if isinstance(record, bytes) else json.dumps(record).encode()
        status, reply = await anyio.to_thread.run_sync(lambda: post(daemon.port, body, headers, "gemini-cli"))
        assert status == 200, reply
        answer: dict[str, Any] = json.loads(reply)
        return answer

    return command if request.param == "command" else http


def base(session: str, event: str, **fields: Any) -> dict[str, Any]:
    return {"session_id": session, "transcript_path": f"/home/u/.gemini/tmp/{session}.json", "cwd": "/repo",
            "hook_event_name": event, "timestamp": "2026-11-27T09:00:00.000Z", **fields}


def write(session: str, event: str = "BeforeTool", **fields: Any) -> dict[str, Any]:
    return base(session, event, tool_name="write_file",
                tool_input={"file_path": "/repo/src/auth.py", "content": "def login(): ...\n"}, **fields)


async def test_a_gemini_session_claims_is_warned_denied_messaged_and_released(
        ask: Ask, daemon: Daemon, namespace: str) -> None:
    started = await ask(base(A, "SessionStart", source="startup"), {})
    assert f"you are agent {AGENT_A}" in started["hookSpecificOutput"]["additionalContext"]
    await ask(base(B, "SessionStart", source="startup"), {})
    assert await ask(write(A), {}) == {}
    assert await holders(daemon.port, namespace) == [AGENT_A]
    warned = await ask(write(B), {})  # Gemini's BeforeTool takes no context: the user is told
    assert AGENT_A in warned["systemMessage"] and set(warned) == {"systemMessage"}
    denied = await ask(write(B), {"MEMENTO_HOOK_LEASES": "enforce"})
    assert denied["decision"] == "deny" and AGENT_A in denied["reason"]
    async with rpc(daemon.port, token("gemini", namespace)) as sender:
        await sender.call("mailbox.send", {"to": AGENT_A, "body": "ping from B"})
    after = await ask(write(A, "AfterTool", tool_response={"llmContent": "ok", "returnDisplay": "ok"}), {})
    assert after["hookSpecificOutput"]["additionalContext"].count("ping from B") == 1
    assert await ask(base(A, "SessionEnd", reason="exit"), {}) == {}
    assert await holders(daemon.port, namespace) == []
    assert await ask(write(B), {"MEMENTO_HOOK_LEASES": "enforce"}) == {}
    assert await holders(daemon.port, namespace) == [AGENT_B]


@pytest.mark.parametrize("body", [b"{not json", json.dumps(base(A, "BeforeModel", llm_request={})).encode()])
async def test_what_the_daemon_does_not_answer_is_an_empty_object_and_writes_nothing(
        ask: Ask, backends: Backends, namespace: str, body: bytes) -> None:
    assert await ask(body, {}) == {}
    assert [key async for key in backends.redis.scan_iter(match=f"*{namespace}*", count=1000)] == []


def test_a_failed_tool_is_a_failure_and_its_call_pairs_with_its_start() -> None:
    before = write(A)
    failed = to_claude(write(A, "AfterTool", tool_response={"llmContent": "", "error": "EACCES"}))
    assert failed["hook_event_name"] == "PostToolUseFailure" and failed["error"] == "EACCES"
    assert failed["tool_name"] == "Write" and failed["tool_use_id"] == call_id(before) == to_claude(before)[
        "tool_use_id"]
