"""The README as a new user reads it: its Python example runs as written, and its Claude Code settings block
registers the hook for every event the hook understands, failed tool runs included."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from memento_sessions.client import Client
from memento_sessions.ingest.claude_hooks import HOOK_EVENTS
from memento_sessions.server.daemon import Daemon
from tests.helpers import token

pytestmark = pytest.mark.anyio
README = (Path(__file__).parent.parent / "README.md").read_text()


def blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


async def test_the_python_example_runs_as_written(daemon: Daemon, namespace: str) -> None:
    (example,) = blocks("python")
    code = example.replace("ws://127.0.0.1:8765/ws", f"ws://127.0.0.1:{daemon.port}/ws")  # the test's daemon
    env = {**os.environ, "MEMENTO_TOKEN": token("reader", namespace)}
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, "-c", code], env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().splitlines() == ["1 start", "2 broke"]


def settings_blocks() -> list[dict[str, Any]]:
    """The README's settings blocks: the http form first, then the command form."""
    return [json.loads(text) for text in blocks("json") if '"hooks"' in text]


def test_the_settings_blocks_register_every_event_the_hook_understands() -> None:
    http, command = (block["hooks"] for block in settings_blocks())
    for form, expected in ((http, "http"), (command, "command")):
        assert sorted(form) == sorted(HOOK_EVENTS), expected
        for name, entries in form.items():
            hooks = [hook for entry in entries for hook in entry["hooks"]]
            assert [hook["type"] for hook in hooks] == [expected], name
            if "ToolUse" in name:
                assert [entry.get("matcher") for entry in entries] == ["*"], name
    for hook in (hook for entries in http.values() for entry in entries for hook in entry["hooks"]):
        assert hook["url"].endswith("/hooks/claude-code")
        assert hook["headers"]["Authorization"] == "Bearer $MEMENTO_TOKEN" and "MEMENTO_TOKEN" in hook["allowedEnvVars"]
    assert {hook["command"] for entries in command.values() for entry in entries for hook in entry["hooks"]} == {
        "memento-sessions hook"}


async def test_a_failed_test_run_makes_the_live_session_broken(daemon: Daemon, namespace: str,
                                                              tmp_path: Path) -> None:
    """PreToolUse then PostToolUseFailure of `pytest`, as Claude Code sends a failing run: the session goes
    broken. A PostToolUse with no exit code after it records no pass (the outcome is unknown)."""
    env = {**os.environ, "MEMENTO_DATA_DIR": str(tmp_path), "MEMENTO_TOKEN": token("claude", namespace),
           "MEMENTO_URL": f"ws://127.0.0.1:{daemon.port}/ws"}
    base = {"session_id": "live-1", "cwd": "/repo", "tool_name": "Bash", "tool_input": {"command": "pytest -q"}}
    inputs = [{**base, "hook_event_name": "PreToolUse", "tool_use_id": "b1"},
              {**base, "hook_event_name": "PostToolUseFailure", "tool_use_id": "b1", "error": "Exit code 1\n1 failed"},
              {**base, "hook_event_name": "PreToolUse", "tool_use_id": "b2"},
              {**base, "hook_event_name": "PostToolUse", "tool_use_id": "b2",
               "tool_response": {"stdout": "", "stderr": "", "interrupted": False}}]
    for record in inputs:
        done = await anyio.run_process([sys.executable, "-m", "memento_sessions.cli", "hook"],
                                       input=json.dumps(record).encode(), env=env, check=False)
        assert done.returncode == 0
    done = await anyio.run_process([sys.executable, "-m", "memento_sessions.cli", "hook", "--flush"], env=env,
                                   check=False)
    assert done.returncode == 0
    async with Client(env["MEMENTO_URL"], token("reader", namespace), reconnect=False) as client:
        session = (await client.call("session.get", {"sessionId": "live-1"}))["session"]
        types = [event["type"] async for event in client.iter_events("live-1")]
    assert session["state"] == "broken"
    assert types.count("broke") == 1 and "test_pass" not in types


def test_the_labels_and_edge_types_kg_load_accepts_are_documented() -> None:
    from memento_sessions.kg.graph import LABELS, RELATIONSHIPS

    text = " ".join(README.split())
    labels = re.search(r"`labels` are among (.*?) \(every node", text)
    types = re.search(r"an edge's `type` is one of (.*?)\.", text)
    assert labels is not None and types is not None
    assert re.findall(r"`(\w+)`", labels.group(1)) == list(LABELS)
    assert re.findall(r"`(\w+)`", types.group(1)) == list(RELATIONSHIPS)


def test_every_ingest_example_finds_the_command() -> None:
    """The examples run `memento-sessions`, which scripts/serve puts in .venv/bin: each block that runs it puts
    .venv/bin on PATH first (or runs it by that path)."""
    for text in (README, (Path(__file__).parent.parent / "docs" / "ingest.md").read_text()):
        runs = [block for block in blocks("sh", text) if "memento-sessions ingest" in block]
        assert runs
        for block in runs:
            assert ".venv/bin" in block[:block.index("memento-sessions")], block
