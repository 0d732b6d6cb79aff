"""The command hook's one round trip: with nothing else spooled it POSTs the input to /hooks/claude-code, which
records it with the spool's read time and root and answers; its lean JSON (cli/fastjson.py) is json's."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from memento_sessions.cli import fastjson
from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import running
from tests.helpers import make_settings
from tests.test_hook import hook_env, hook_input, run_hook, stored

pytestmark = pytest.mark.anyio
READ_AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def imports(stderr: bytes) -> set[str]:
    return {line.split("|")[-1].strip() for line in stderr.decode().splitlines() if "|" in line}


async def test_an_answered_edit_takes_one_post_and_converts_nothing_in_the_hook(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    """A second session's edit of a file the first holds: warned, its events stored with the time the hook read
    the input (the spool's), the spool left empty, and the hook process imported neither the converters nor
    the json package (re) nor its WebSocket client."""
    settings = make_settings(backend_urls, tmp_path / "d", port=free_port())
    async with running(settings) as daemon:
        env = {**hook_env(tmp_path, namespace, daemon.port), "CLAUDE_PROJECT_DIR": "/repo"}
        assert (await anyio.to_thread.run_sync(run_hook, env, hook_input("claude-aaaa", 0))).returncode == 0
        traced = {**env, "PYTHONPROFILEIMPORTTIME": "1"}
        done = await anyio.to_thread.run_sync(run_hook, traced, hook_input("claude-bbbb", 0))
        said = json.loads(done.stdout)
        assert "claude:claudeaa" in said["hookSpecificOutput"]["additionalContext"]
        lean = {"memento_sessions.ingest.claude_hooks", "json", "re", "enum", "typing", "memento_sessions.cli.pipeline"}
        assert done.returncode == 0 and imports(done.stderr) & lean == set()
        assert (tmp_path / "hook-spool" / "spool.jsonl").read_text() == ""  # delivered by the POST
        events = await stored(daemon.port, namespace, "claude-bbbb")
        # the hook's read time (the spool's, to the microsecond), not the daemon's clock (to the millisecond)
        assert events and all(READ_AT.fullmatch(event["timestamp"]) for event in events)
        again = await anyio.to_thread.run_sync(run_hook, env, hook_input("claude-bbbb", 0))
        assert again.returncode == 0
        assert len(await stored(daemon.port, namespace, "claude-bbbb")) == len(events)  # its ids: the tool use's


async def test_a_backlog_goes_by_the_websocket_in_order_then_the_post_path_again(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    """Inputs spooled while the daemon was away are delivered first, in order, by the WebSocket path (the POST
    is only for a spool holding nothing but the input just read); then the next call posts."""
    port = free_port()
    env = hook_env(tmp_path, namespace, port)
    for n in range(4):  # the daemon away: all spooled
        assert (await anyio.to_thread.run_sync(run_hook, env, hook_input("claude-cccc", n))).returncode == 0
    settings = make_settings(backend_urls, tmp_path / "d", port=port)
    async with running(settings) as daemon:
        assert (await anyio.to_thread.run_sync(run_hook, env, hook_input("claude-cccc", 4))).returncode == 0
        ids = [event["id"] for event in await stored(daemon.port, namespace, "claude-cccc")]
        traced = {**env, "PYTHONPROFILEIMPORTTIME": "1"}
        done = await anyio.to_thread.run_sync(run_hook, traced, hook_input("claude-cccc", 5))
        assert "memento_sessions.ingest.claude_hooks" not in imports(done.stderr)  # posted
        after = [event["id"] for event in await stored(daemon.port, namespace, "claude-cccc")]
    assert len(ids) >= 5 and after[:len(ids)] == ids and len(after) > len(ids)
    assert (tmp_path / "hook-spool" / "spool.jsonl").read_text() == ""


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, None, True, False, "é\u2028\"\\x"], "b": {"c": -1e300, "d": 0.1, "e": ""}},
    [], {}, "text", 3, -0.0, 1e16, [[[]]], {"k": "\U0001f600 emoji", "n": 12345678901234567890},
])
def test_the_lean_json_is_the_json_package_s(value: Any) -> None:
    text = fastjson.dumps(value)
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert fastjson.loads(text) == json.loads(text) == value
    assert fastjson.loads(f" \n{text}\t".encode()) == value


def test_the_lean_json_refuses_what_json_refuses() -> None:
    for bad in ("", "{", "{}x", "nul", "[1,]", '{"a" 1}', "\x00"):
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            fastjson.loads(bad)
    assert math.isinf(fastjson.loads("Infinity")) and fastjson.dumps(float("nan")) == "NaN"
    with pytest.raises(TypeError):
        fastjson.dumps({"a": object()})
