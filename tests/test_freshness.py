"""Fresh handoffs: the hook records the agent's git HEAD and dirty-tree digest at SessionStart and Stop, and
bridge.handoff says how fresh that is and how the receiver's own state compares."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from memento_sessions.cli.gitstate import DEFERRED, FIELD, stamp, state
from memento_sessions.cli.stamp import wait_for_children
from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc
from tests.test_hook import hook_env, run_hook, stored

pytestmark = pytest.mark.anyio
H1, H2 = "1" * 40, "2" * 40
D1, D2 = "a" * 64, "b" * 64


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True, env=env).stdout.decode()


def repo_with(path: Path, files: int) -> Path:
    path.mkdir()
    git(path, "init", "-q")
    for i in range(files):
        (path / f"f{i}.py").write_text(f"x = {i}\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "first")
    return path


async def test_the_state_is_the_head_and_a_digest_that_changes_with_the_dirty_tree(tmp_path: Path) -> None:
    repo = repo_with(tmp_path / "r", 3)
    clean = state(str(repo), 5.0)
    assert clean is not None and clean["head"] == git(repo, "rev-parse", "HEAD").strip()
    assert state(str(repo), 5.0) == clean  # the same tree, the same digest
    (repo / "f1.py").write_text("x = 'edited'\n")
    edited = state(str(repo), 5.0)
    assert edited is not None and edited["head"] == clean["head"] and edited["dirtyDigest"] != clean["dirtyDigest"]
    (repo / "f1.py").write_text("x = 'edited again'\n")  # same status line, other content: another digest
    again = state(str(repo), 5.0)
    assert again is not None and again["dirtyDigest"] not in (clean["dirtyDigest"], edited["dirtyDigest"])
    assert state(str(tmp_path), 5.0) is None  # not a work tree
    assert state(str(repo), 0.0) is None  # past its time: nothing
    record: dict[str, Any] = {"hook_event_name": "PostToolUse", "cwd": str(repo)}
    stamp(record)
    assert FIELD not in record  # only SessionStart and Stop are stamped


async def test_the_stamp_on_a_10000_file_repository_is_bounded(tmp_path: Path) -> None:
    repo = repo_with(tmp_path / "big", 10_000)
    (repo / "f7.py").write_text("changed\n")
    times = []
    for _ in range(5):
        started = time.perf_counter()
        assert state(str(repo), 5.0) is not None
        times.append(time.perf_counter() - started)
    print(f"git state of a 10,000-file repository: median {sorted(times)[2] * 1000:.1f} ms")
    assert sorted(times)[2] < 0.5  # generous: ~20 ms on a quiet machine


def spooled(folder: Path) -> list[dict[str, Any]]:
    path = folder / "spool.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_the_hook_leaves_the_stamp_to_a_child_and_the_next_call_delivers_it(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    """On a 10,000-file work tree the SessionStart hook returns without running git: a child takes the state,
    spools it with the input's own time and delivers it; when it cannot (another hook holds the delivery, here
    the test), the next hook call delivers it, without a --flush."""
    repo = repo_with(tmp_path / "big", 10_000)
    (repo / "f7.py").write_text("changed\n")
    folder = tmp_path / "hook-spool"
    settings = make_settings(backend_urls, tmp_path / "d", port=free_port())
    async with running(settings) as daemon:
        env = {**hook_env(tmp_path, namespace, daemon.port), "CLAUDE_PROJECT_DIR": str(repo)}
        start = {"session_id": "claude-later", "hook_event_name": "SessionStart", "cwd": str(repo)}
        folder.mkdir()
        with (folder / "deliver.lock").open("w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # a hook delivering: neither the call nor its child can
            assert (await anyio.to_thread.run_sync(run_hook, env, start)).returncode == 0
            assert await anyio.to_thread.run_sync(wait_for_children, str(folder))
        lines = spooled(folder)
        assert [bool(line["input"].get(DEFERRED)) for line in lines] == [False, True]
        assert FIELD not in lines[0]["input"] and lines[1]["at"] == lines[0]["at"]  # the input's own time
        prompt = {"session_id": "claude-later", "hook_event_name": "UserPromptSubmit", "cwd": str(repo),
                  "prompt": "go"}
        assert (await anyio.to_thread.run_sync(run_hook, env, prompt)).returncode == 0
        assert spooled(folder) == []  # all delivered by that call
        events = await stored(daemon.port, namespace, "claude-later")
        records = [event for event in events if event["type"] == "git:state"]
        now = state(str(repo), 5.0)
        assert now is not None and len(records) == 1 and records[0]["data"] == {**now, "hook": "SessionStart"}
        assert records[0]["timestamp"] == lines[0]["at"]
        # Nothing held: the child delivers its stamp itself, and the next call has nothing to send first.
        stop = {"session_id": "claude-later", "hook_event_name": "Stop", "cwd": str(repo)}
        assert (await anyio.to_thread.run_sync(run_hook, env, stop)).returncode == 0
        assert await anyio.to_thread.run_sync(wait_for_children, str(folder))
        assert spooled(folder) == []
        events = await stored(daemon.port, namespace, "claude-later")
        assert [event["data"]["hook"] for event in events if event["type"] == "git:state"] == ["SessionStart", "Stop"]


async def test_the_hook_records_the_git_state_and_the_handoff_returns_it(backend_urls: Endpoints, tmp_path: Path,
                                                                         namespace: str) -> None:
    repo = repo_with(tmp_path / "r", 2)
    settings = make_settings(backend_urls, tmp_path / "d", port=free_port())
    async with running(settings) as daemon:
        env = hook_env(tmp_path, namespace, daemon.port)
        start = {"session_id": "claude-git", "hook_event_name": "SessionStart", "cwd": str(repo), "source": "startup"}
        assert (await anyio.to_thread.run_sync(run_hook, env, start)).returncode == 0
        # The state is taken by a detached child just after the hook returns: the agent's first edit comes later.
        await anyio.to_thread.run_sync(wait_for_children, str(tmp_path / "hook-spool"))
        (repo / "f0.py").write_text("edited\n")
        stop = {"session_id": "claude-git", "hook_event_name": "Stop", "cwd": str(repo)}
        assert (await anyio.to_thread.run_sync(run_hook, env, stop)).returncode == 0
        assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
        events = await stored(daemon.port, namespace, "claude-git")
        records = [event for event in events if event["type"] == "git:state"]
        head = git(repo, "rev-parse", "HEAD").strip()
        assert [(r["data"]["hook"], r["data"]["head"]) for r in records] == [("SessionStart", head), ("Stop", head)]
        assert records[0]["data"]["dirtyDigest"] != records[1]["data"]["dirtyDigest"]
        now = state(str(repo), 5.0)
        assert now is not None and now["dirtyDigest"] == records[1]["data"]["dirtyDigest"]
        async with rpc(daemon.port, token("b", namespace)) as b:
            handoff = await b.call("bridge.handoff", {"sessionId": "claude-git", **{
                "head": now["head"], "dirtyDigest": now["dirtyDigest"]}})
        assert handoff["freshness"] == {"head": head, "dirtyDigest": now["dirtyDigest"],
                                        "recordedAt": records[1]["timestamp"], "status": "fresh",
                                        "eventsSince": events[-1]["seq"] - records[1]["seq"]}
        assert [event["type"] for event in events if event["seq"] > records[1]["seq"]] == ["git:patch"]


def record(head: str, digest: str) -> dict[str, Any]:
    return {"type": "git:state", "data": {"head": head, "dirtyDigest": digest, "hook": "Stop"}}


def edit(path: str) -> dict[str, Any]:
    return {"type": "modified", "changeInfo": {"entityIds": [f"file:{path}"], "operation": "modified"}}


async def test_the_receiver_is_told_fresh_behind_or_diverged_with_the_files_changed_since(
        daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        sid = (await a.call("session.create", {}))["sessionId"]
        assert (await b.call("bridge.handoff", {"sessionId": sid}))["freshness"] is None  # nothing recorded
        await a.call("event.emitBatch", {"sessionId": sid, "events": [
            record(H1, D1), edit("src/a.py"), {"type": "note"}, record(H1, D2)]})

        async def status(head: str, digest: str | None = None) -> dict[str, Any]:
            params = {"sessionId": sid, "head": head, **({"dirtyDigest": digest} if digest else {})}
            found: dict[str, Any] = (await b.call("bridge.handoff", params))["freshness"]
            return found

        newest = await status(H1, D2)
        assert newest["status"] == "fresh" and newest["eventsSince"] == 0 and newest["dirtyDigest"] == D2
        assert await status(H1, D1) == {**newest, "status": "behind", "changedFiles": ["src/a.py"]}
        assert (await status(H2))["status"] == "diverged"
        assert (await status(H1))["status"] == "fresh"  # a head alone matches the newest record at it

        await a.call("event.emitBatch", {"sessionId": sid, "events": [edit("src/b.py"), edit("src/a.py")]})
        later = await status(H1, D2)
        assert later["eventsSince"] == 2 and later["status"] == "behind" and later["changedFiles"] == ["src/a.py",
                                                                                                         "src/b.py"]
        assert (await status(H1, D1))["changedFiles"] == ["src/a.py", "src/b.py"]


@pytest.mark.parametrize(("params", "field"), [
    ({"dirtyDigest": D1}, "dirtyDigest"),
    ({"head": "HEAD"}, "head"),
    ({"head": H1, "dirtyDigest": "x"}, "dirtyDigest"),
    ({"head": 1}, "head"),
])
async def test_bad_handoff_params_are_refused_naming_the_field(daemon: Daemon, namespace: str,
                                                                params: dict[str, Any], field: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a:
        sid = (await a.call("session.create", {}))["sessionId"]
        error = await a.error("bridge.handoff", {"sessionId": sid, **params})
        assert error["code"] == -32602 and any(field in item["field"] or field in item["message"]
                                               for item in error["data"])


def test_the_session_start_hook_runs_no_git_itself(tmp_path: Path, namespace: str) -> None:
    """The hook call only spawns the child: it imports neither subprocess nor select (git is not run there)."""
    repo = repo_with(tmp_path / "r", 2)
    env = {**hook_env(tmp_path, namespace, free_port()), "CLAUDE_PROJECT_DIR": str(repo),
           "PYTHONPROFILEIMPORTTIME": "1"}
    done = run_hook(env, {"session_id": "claude-lean", "hook_event_name": "SessionStart", "cwd": str(repo)})
    imported = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines() if "|" in line}
    assert done.returncode == 0 and "memento_sessions.cli.stamp" in imported
    assert imported & {"subprocess", "select"} == set()
