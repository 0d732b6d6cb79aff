"""`session suspend` from a git work tree stores its uncommitted work with the session; a suspended session,
however it was suspended, keeps the work stored before, and `session checkout` brings it back after resume."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.cli import main
from memento_sessions.cli.gitstate import PATCH_MAX, newest_patch, patch_events, work
from memento_sessions.lifecycle.methods import LifecycleService
from memento_sessions.server.daemon import Daemon
from tests.helpers import SECRET, token
from tests.rpcsocket import rpc
from tests.test_cli_session import cli_lines, run
from tests.test_freshness import git, repo_with
from tests.test_hook import hook_env, run_hook, stored

pytestmark = pytest.mark.anyio

BLOB = bytes(range(256)) * 4  # an untracked binary file


@pytest.fixture
def cli(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, namespace: str) -> str:
    """The CLI pointed at the test's daemon, git given time enough on a busy machine."""
    monkeypatch.setenv("MEMENTO_PORT", str(daemon.port))
    monkeypatch.setenv("MEMENTO_AUTH_SECRET", SECRET)
    monkeypatch.setenv("MEMENTO_DATA_DIR", str(daemon.settings.data_dir))
    monkeypatch.setenv("MEMENTO_HOOK_GIT_TIMEOUT", "20")
    monkeypatch.delenv("MEMENTO_TOKEN", raising=False)
    monkeypatch.delenv("MEMENTO_HOOK_PATCH_MAX_BYTES", raising=False)
    return namespace


def trees(tmp_path: Path) -> tuple[Path, Path]:
    """The agent's work tree, one commit ahead of a clean clone, with a tracked edit, a staged deletion and an
    untracked binary file."""
    repo = repo_with(tmp_path / "agent", 3)
    other = tmp_path / "taker"
    git(tmp_path, "clone", "-q", str(repo), str(other))
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    (repo / "f0.py").write_text("edited\n")
    git(repo, "rm", "-q", "f1.py")
    (repo / "new.bin").write_bytes(BLOB)
    return repo, other


def carries_the_work(repo: Path, other: Path) -> None:
    assert git(other, "rev-parse", "HEAD") == git(repo, "rev-parse", "HEAD")
    assert (other / "f0.py").read_text() == "edited\n" and not (other / "f1.py").exists()
    assert (other / "f2.py").read_text() == "x = 2\n" and (other / "new.bin").read_bytes() == BLOB


async def session_cli(capsys: pytest.CaptureFixture[str], namespace: str, *argv: str) -> tuple[int, str, str]:
    """`memento-sessions session --namespace NAMESPACE ARGV...` in process: its exit code, stdout and stderr."""
    capsys.readouterr()
    code = await anyio.to_thread.run_sync(main, ["session", "--namespace", namespace, *argv])
    out, err = capsys.readouterr()
    return code, out, err


async def patches(daemon: Daemon, namespace: str, sid: str) -> list[dict[str, Any]]:
    return [e["data"] for e in await stored(daemon.port, namespace, sid) if e["type"] == "git:patch"]


async def test_suspend_from_a_dirty_tree_then_resume_and_checkout_reproduce_the_work(
        daemon: Daemon, cli: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo, other = trees(tmp_path)
    staged = git(repo, "diff", "--cached", "--name-only")
    async with rpc(daemon.port, token("alice", cli)) as peer:
        await peer.call("session.create", {"sessionId": "s1", "entityIds": ["fn:a"]})
    monkeypatch.chdir(repo)
    code, out, err = await session_cli(capsys, cli, "--json", "suspend", "s1")
    assert code == 0 and json.loads(out)["status"] == "suspended"
    head = git(repo, "rev-parse", "HEAD").strip()
    assert git(repo, "diff", "--cached", "--name-only") == staged  # the agent's index untouched
    work = await patches(daemon, cli, "s1")  # read from Postgres: the session is suspended
    assert [(p["head"], p["part"], p["parts"]) for p in work] == [(head, 0, 1)] and 100 < work[0]["bytes"] < 4096
    assert cli_lines(err) == [f"memento-sessions session suspend: stored {work[0]['bytes']} bytes of uncommitted "
                              f"work of . at {head}"]

    code, out = await run(capsys, "session", "--namespace", cli, "--json", "resume", "s1")
    assert code == 0 and json.loads(out)["seq"] == 2  # the start and the one part, the same seqs
    git(other, "fetch", "-q", str(repo), "HEAD")
    code, out = await run(capsys, "session", "--namespace", cli, "checkout", "s1", "--into", str(other))
    assert code == 0 and out.strip() == f"applied {work[0]['bytes']} bytes of uncommitted work of s1 to {other} " \
        f"at {head}"
    carries_the_work(repo, other)


async def test_a_patch_over_the_limit_is_refused_and_said_and_the_session_still_suspends(
        daemon: Daemon, cli: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo, other = trees(tmp_path)
    async with rpc(daemon.port, token("alice", cli)) as peer:
        await peer.call("session.create", {"sessionId": "big"})
    monkeypatch.setenv("MEMENTO_HOOK_PATCH_MAX_BYTES", "100")
    code, out, err = await session_cli(capsys, cli, "--json", "suspend", "big", "--work-tree", str(repo))
    assert code == 0 and json.loads(out)["status"] == "suspended"
    assert cli_lines(err) == [f"memento-sessions session suspend: the uncommitted work of {repo} was not stored: "
                              "larger than 100 bytes (MEMENTO_HOOK_PATCH_MAX_BYTES)"]
    head = git(repo, "rev-parse", "HEAD").strip()
    assert await patches(daemon, cli, "big") == [{"head": head, "refused": "too_large", "max": 100}]
    assert (await run(capsys, "session", "--namespace", cli, "resume", "big"))[0] == 0
    code, _, err = await session_cli(capsys, cli, "checkout", "big", "--into", str(other))
    assert code == 1 and cli_lines(err) == [
        "memento-sessions session checkout: the uncommitted work was not stored: larger than 100 bytes "
        "(MEMENTO_HOOK_PATCH_MAX_BYTES)"]


async def test_outside_a_work_tree_or_with_no_work_suspend_stores_nothing(
        daemon: Daemon, cli: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo, _ = trees(tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()
    async with rpc(daemon.port, token("alice", cli)) as peer:
        for sid in ("out", "off", "named"):
            await peer.call("session.create", {"sessionId": sid})
    for where, argv in ((plain, ["suspend", "out"]), (repo, ["suspend", "off", "--no-work"])):
        monkeypatch.chdir(where)
        code, out, err = await session_cli(capsys, cli, "--json", *argv)
        assert code == 0 and json.loads(out)["status"] == "suspended" and json.loads(out)["seq"] == 0
        assert cli_lines(err) == []
        assert await patches(daemon, cli, argv[1]) == []
    code, _, err = await session_cli(capsys, cli, "suspend", "named", "--work-tree", str(plain))
    assert code == 0 and cli_lines(err) == [  # a tree named and not one: said
        f"memento-sessions session suspend: {plain} is not a git work tree with a commit: no uncommitted work "
        "stored"]


async def test_git_past_its_time_stores_nothing_says_so_and_the_session_suspends(
        daemon: Daemon, cli: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo, _ = trees(tmp_path)
    async with rpc(daemon.port, token("alice", cli)) as peer:
        await peer.call("session.create", {"sessionId": "slow"})
    monkeypatch.setenv("MEMENTO_HOOK_GIT_TIMEOUT", "0.001")  # no git answers that fast
    code, out, err = await session_cli(capsys, cli, "--json", "suspend", "slow", "--work-tree", str(repo))
    assert code == 0 and json.loads(out)["status"] == "suspended"
    assert cli_lines(err) == [f"memento-sessions session suspend: the uncommitted work of {repo} was not stored: "
                              "git took longer than MEMENTO_HOOK_GIT_TIMEOUT (0.001 s)"]
    assert await patches(daemon, cli, "slow") == []


async def test_a_session_that_cannot_be_suspended_is_said_once_by_the_suspend(
        daemon: Daemon, cli: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo, _ = trees(tmp_path)
    async with rpc(daemon.port, token("alice", cli)) as peer:
        await peer.call("session.create", {"sessionId": "done", "entityIds": ["fn:a"]})
        await peer.call("session.checkpoint", {"sessionId": "done", "final": True})
    monkeypatch.chdir(repo)
    code, _, err = await session_cli(capsys, cli, "suspend", "done")
    assert code == 1 and cli_lines(err) == [
        "memento-sessions session suspend: a completed session is not suspended (-32009)"]
    assert await patches(daemon, cli, "done") == []


async def test_a_suspend_from_a_clean_tree_records_its_head_over_older_work(
        daemon: Daemon, cli: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo, other = trees(tmp_path)
    async with rpc(daemon.port, token("alice", cli)) as peer:
        await peer.call("session.create", {"sessionId": "s2"})
    monkeypatch.chdir(repo)
    assert (await run(capsys, "session", "--namespace", cli, "suspend", "s2"))[0] == 0
    assert (await run(capsys, "session", "--namespace", cli, "resume", "s2"))[0] == 0
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the work, committed")  # then nothing is left uncommitted
    code, _, err = await session_cli(capsys, cli, "suspend", "s2")
    head = git(repo, "rev-parse", "HEAD").strip()
    assert code == 0 and cli_lines(err) == [
        f"memento-sessions session suspend: . has no uncommitted work: stored its HEAD {head}"]
    assert (await run(capsys, "session", "--namespace", cli, "resume", "s2"))[0] == 0
    git(other, "fetch", "-q", str(repo), "HEAD")
    code, out = await run(capsys, "session", "--namespace", cli, "checkout", "s2", "--into", str(other))
    assert code == 0 and out.strip().startswith("applied 0 bytes")
    carries_the_work(repo, other)  # the committed work at the new HEAD, not the older patch at the old one
    assert git(other, "status", "--porcelain") == ""


async def test_a_patch_stored_at_stop_survives_an_idle_and_an_rpc_suspend(
        daemon: Daemon, cli: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo, other = trees(tmp_path)
    r = aioredis.Redis.from_url(daemon.settings.redis_url or "", decode_responses=True)
    async with rpc(daemon.port, token("claude", cli)) as peer:
        await peer.call("session.create", {"sessionId": "idle-1", "onIdle": "suspend", "ttl": 60})
        env = {**hook_env(tmp_path / "hookdata", cli, daemon.port), "MEMENTO_HOOK_GIT_TIMEOUT": "20"}
        stop = {"session_id": "idle-1", "hook_event_name": "Stop", "cwd": str(repo)}
        assert (await anyio.to_thread.run_sync(run_hook, env, stop)).returncode == 0
        assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
        work = await patches(daemon, cli, "idle-1")
        assert len(work) == 1 and work[0]["head"] == git(repo, "rev-parse", "HEAD").strip()
        seq = (await peer.call("session.get", {"sessionId": "idle-1"}))["session"]["seq"]

        skeys = keys.session_keys(cli, "idle-1")
        for key in skeys.all():
            await r.pexpire(key, 30_000)  # idle: inside the margin the lifecycle suspends it in
        assert daemon.services is not None
        assert (await LifecycleService(daemon.services.manager, daemon.services.backends).move())[0] >= 1
        assert await r.exists(skeys.session) == 0
        assert (await peer.call("session.get", {"sessionId": "idle-1"}))["session"]["status"] == "suspended"
        assert await patches(daemon, cli, "idle-1") == work
        code, out = await run(capsys, "session", "--namespace", cli, "--json", "resume", "idle-1")
        assert code == 0 and json.loads(out)["seq"] == seq
        await peer.call("session.suspend", {"sessionId": "idle-1"})  # as the MCP tool does
        await peer.call("session.resume", {"sessionId": "idle-1"})
    await r.aclose()
    git(other, "fetch", "-q", str(repo), "HEAD")
    code, out = await run(capsys, "session", "--namespace", cli, "checkout", "idle-1", "--into", str(other))
    assert code == 0 and "applied" in out
    carries_the_work(repo, other)



async def test_a_stop_at_a_clean_tree_records_its_head_over_an_earlier_stop_s_work(
        daemon: Daemon, cli: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo, other = trees(tmp_path)
    env = {**hook_env(tmp_path / "hookdata", cli, daemon.port), "MEMENTO_HOOK_GIT_TIMEOUT": "20"}
    stop = {"session_id": "claude-c", "hook_event_name": "Stop", "cwd": str(repo)}
    assert (await anyio.to_thread.run_sync(run_hook, env, stop)).returncode == 0
    assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the work, committed")  # then the agent stops again, nothing uncommitted
    assert (await anyio.to_thread.run_sync(run_hook, env, stop)).returncode == 0
    assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
    work = await patches(daemon, cli, "claude-c")
    assert [p["bytes"] > 0 for p in work] == [True, False] and work[1]["head"] == git(repo, "rev-parse", "HEAD").strip()
    git(other, "fetch", "-q", str(repo), "HEAD")
    code, out = await run(capsys, "session", "--namespace", cli, "checkout", "claude-c", "--into", str(other))
    assert code == 0 and out.startswith("applied 0 bytes")
    carries_the_work(repo, other)
    assert git(other, "status", "--porcelain") == ""


async def test_checkout_takes_the_newest_work_by_when_it_was_taken_and_passes_over_parts_not_its_own(
        daemon: Daemon, cli: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo, other = trees(tmp_path)
    newer = work(str(repo), 20.0, PATCH_MAX, True)
    (repo / "f2.py").write_text("older\n")
    older = work(str(repo), 20.0, PATCH_MAX, True)  # another tree's work, taken a second before
    assert newer is not None and older is not None and newer["sha256"] != older["sha256"]
    odd = [{"id": "git:patch:2026-01-01T00:00:03.000000Z:0", "type": "git:patch", "data": {"part": "x"}},
           {"id": "git:patch:2026-01-01T00:00:04.000000Z:0", "type": "git:patch", "data": {**newer, "parts": 2}}]
    async with rpc(daemon.port, token("alice", cli)) as peer:
        for sid, events in (("late", patch_events(newer, "2026-01-01T00:00:02.000000Z")
                             + patch_events(older, "2026-01-01T00:00:01.000000Z")),  # a Stop delivered late
                            ("odd", patch_events(newer, "2026-01-01T00:00:02.000000Z") + odd)):
            await peer.call("session.create", {"sessionId": sid})
            await peer.call("event.emitBatch", {"sessionId": sid, "events": events})
    (repo / "f2.py").write_text("x = 2\n")
    git(other, "fetch", "-q", str(repo), "HEAD")
    for sid in ("late", "odd"):
        code, out = await run(capsys, "session", "--namespace", cli, "checkout", sid, "--into", str(other))
        assert code == 0 and out.startswith(f"applied {newer['bytes']} bytes")
        carries_the_work(repo, other)
        git(other, "reset", "-q", "--hard")
        git(other, "clean", "-qfd")


def test_a_stored_head_that_is_no_commit_id_is_refused() -> None:
    found = work_of(b"diff --git a/x b/x\n", head="--orphan=x")
    assert newest_patch(patch_events(found, "2026-01-01T00:00:01.000000Z")) == \
        "the stored uncommitted work is damaged (its digest or its HEAD does not match)"
    assert newest_patch(patch_events({**found, "head": "a" * 40}, "2026-01-01T00:00:01.000000Z")) == (
        "a" * 40, b"diff --git a/x b/x\n")


def work_of(patch: bytes, head: str) -> dict[str, Any]:
    return {"head": head, "bytes": len(patch), "sha256": hashlib.sha256(patch).hexdigest(),
            "parts": [base64.b64encode(patch).decode()]}
