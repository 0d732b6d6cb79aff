"""Commits made during a session: the hook turns a Bash `git commit` into a `commit` event (SHA, message,
files), and bridge.commit says which session produced a commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import running
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc
from tests.test_freshness import git, repo_with
from tests.test_hook import hook_env, run_hook, stored

pytestmark = pytest.mark.anyio


def bash(sid: str, repo: Path, command: str, stdout: str, n: int) -> dict[str, Any]:
    return {"session_id": sid, "hook_event_name": "PostToolUse", "cwd": str(repo), "tool_name": "Bash",
            "tool_use_id": f"toolu_{n:04d}", "tool_input": {"command": command},
            "tool_response": {"stdout": stdout, "stderr": "", "interrupted": False}}


async def test_a_git_commit_run_by_the_agent_becomes_a_commit_event_and_names_its_session(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    repo = repo_with(tmp_path / "r", 2)
    (repo / "f0.py").write_text("fixed\n")
    (repo / "new.py").write_text("added\n")
    git(repo, "add", "-A")
    printed = git(repo, "commit", "-m", "Fix login\n\nThe token was read twice.")
    sha = git(repo, "rev-parse", "HEAD").strip()
    async with running(make_settings(backend_urls, tmp_path / "d", port=free_port())) as daemon:
        env = hook_env(tmp_path, namespace, daemon.port)
        commit = bash("claude-c", repo, "git commit -m 'Fix login'", printed, 1)
        nothing = bash("claude-c", repo, "git commit -m again", "nothing to commit, working tree clean\n", 2)
        for record in (commit, nothing):
            assert (await anyio.to_thread.run_sync(run_hook, env, record)).returncode == 0
        assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
        commits = [event for event in await stored(daemon.port, namespace, "claude-c") if event["type"] == "commit"]
        message = "Fix login\n\nThe token was read twice."
        assert [event["data"] for event in commits] == [{"sha": sha, "message": message, "files": ["f0.py", "new.py"]}]
        async with rpc(daemon.port, token("b", namespace)) as b:
            found = await b.call("bridge.commit", {"sha": sha[:8]})
            assert (found["sha"], found["sessionId"], found["seq"], found["agentId"]) == \
                (sha, "claude-c", commits[0]["seq"], "claude:claudec")  # the Claude Code session's own agent
            assert (await b.error("bridge.commit", {"sha": "0" * 40}))["code"] == -32004
            bad = await b.error("bridge.commit", {"sha": "HEAD"})
            assert bad["code"] == -32602 and bad["data"][0]["field"] == "sha"


async def test_the_commit_index_keeps_the_newest_max_commits_and_the_first_session(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path, commits_max=3)) as daemon, \
            rpc(daemon.port, token("a", namespace)) as a:
        first, second = [(await a.call("session.create", {}))["sessionId"] for _ in range(2)]
        shas = ["abcdef0" + f"{i}" * 33 for i in range(1, 5)]

        def commit(sha: str) -> dict[str, Any]:
            return {"type": "commit", "data": {"sha": sha}}

        await a.call("event.emit", {"sessionId": first, "event": commit(shas[0])})
        await a.call("event.emitBatch", {"sessionId": second, "events": [commit(shas[0]), commit(shas[1])]})
        assert [(await a.call("bridge.commit", {"sha": sha}))["sessionId"] for sha in shas[:2]] == [first, second]
        ambiguous = await a.error("bridge.commit", {"sha": "abcdef0"})
        assert ambiguous["code"] == -32602 and "more than one" in ambiguous["data"][0]["message"]
        await a.call("event.emitBatch", {"sessionId": second, "events": [commit(shas[2]), commit(shas[3])]})
        assert (await a.error("bridge.commit", {"sha": shas[0]}))["code"] == -32004  # the oldest, past the cap
        assert [(await a.call("bridge.commit", {"sha": sha}))["sessionId"] for sha in shas[1:]] == [second] * 3


async def test_the_uncommitted_work_stored_at_stop_is_checked_out_into_another_work_tree(
        backend_urls: Endpoints, tmp_path: Path, namespace: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from memento_sessions.cli import main
    from tests.test_cli_session import run as cli

    repo = repo_with(tmp_path / "a", 3)
    other = tmp_path / "b"
    git(tmp_path, "clone", "-q", str(repo), str(other))
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")  # the other tree is one commit behind, and clean
    (repo / "f0.py").write_text("edited\n")
    (repo / "f1.py").unlink()
    (repo / "new.bin").write_bytes(bytes(range(256)) * 4)  # untracked, binary
    git(repo, "add", "f1.py")  # a staged deletion: the agent's index is left as it was
    staged = git(repo, "diff", "--cached", "--name-only")
    async with running(make_settings(backend_urls, tmp_path / "d", port=free_port())) as daemon:
        env = hook_env(tmp_path, namespace, daemon.port)
        stop = {"session_id": "claude-p", "hook_event_name": "Stop", "cwd": str(repo)}
        assert (await anyio.to_thread.run_sync(run_hook, env, stop)).returncode == 0
        assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
        assert git(repo, "diff", "--cached", "--name-only") == staged
        parts = [e for e in await stored(daemon.port, namespace, "claude-p") if e["type"] == "git:patch"]
        assert len(parts) == 1 and parts[0]["data"]["head"] == git(repo, "rev-parse", "HEAD").strip()

        big = {**stop, "session_id": "claude-q"}
        assert (await anyio.to_thread.run_sync(run_hook, {**env, "MEMENTO_HOOK_PATCH_MAX_BYTES": "100"}, big)
                ).returncode == 0
        assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
        refused = [e["data"] for e in await stored(daemon.port, namespace, "claude-q") if e["type"] == "git:patch"]
        assert refused == [{"head": parts[0]["data"]["head"], "refused": "too_large", "max": 100}]

        monkeypatch.setenv("MEMENTO_PORT", str(daemon.port))
        monkeypatch.setenv("MEMENTO_TOKEN", token("cli", namespace))
        monkeypatch.setenv("MEMENTO_DATA_DIR", str(tmp_path / "cli"))
        git(other, "fetch", "-q", str(repo), "HEAD")
        code, out = await cli(capsys, "session", "checkout", "claude-p", "--into", str(other))
        assert code == 0 and "applied" in out
        assert (other / "f0.py").read_text() == "edited\n" and not (other / "f1.py").exists()
        assert (other / "new.bin").read_bytes() == bytes(range(256)) * 4
        assert git(other, "rev-parse", "HEAD") == git(repo, "rev-parse", "HEAD")
        capsys.readouterr()
        code = await anyio.to_thread.run_sync(main, ["session", "checkout", "claude-q", "--into", str(other)])
        assert code == 1 and "larger than 100 bytes (MEMENTO_HOOK_PATCH_MAX_BYTES)" in capsys.readouterr().err
