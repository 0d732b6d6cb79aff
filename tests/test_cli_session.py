"""`memento-sessions session ...` against a running daemon: tables for people, --json for scripts."""

from __future__ import annotations

import json

import anyio
import pytest

from memento_sessions.cli import main
from memento_sessions.server.daemon import Daemon
from tests.helpers import SECRET, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


@pytest.fixture
def cli_env(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, namespace: str) -> str:
    monkeypatch.setenv("MEMENTO_PORT", str(daemon.port))
    monkeypatch.setenv("MEMENTO_AUTH_SECRET", SECRET)
    monkeypatch.setenv("MEMENTO_DATA_DIR", str(daemon.settings.data_dir))
    monkeypatch.delenv("MEMENTO_TOKEN", raising=False)
    return namespace


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = await anyio.to_thread.run_sync(main, list(argv))
    return code, capsys.readouterr().out


async def test_list_show_diff_fork_suspend_resume_complete(daemon: Daemon, cli_env: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    ns = cli_env
    async with rpc(daemon.port, token("alice", ns)) as peer:
        good = (await peer.call("session.create", {"sessionId": "good", "entityIds": ["fn:a"]}))["sessionId"]
        bad = (await peer.call("session.create", {"sessionId": "bad-one", "entityIds": ["fn:b"]}))["sessionId"]
        await peer.call("event.emit", {"sessionId": bad, "event": {"type": "broke"}})
    code, out = await run(capsys, "session", "--namespace", ns, "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["SESSIONID", "STATUS", "STATE", "SEQ", "AGENTS", "UPDATEDAT"]
    assert lines[1].split()[:6] == ["!", "bad-one", "active", "broken", "2", "alice"]  # newest first, marked
    assert lines[2].startswith("  good   ") and lines[2].split()[:5] == ["good", "active", "working", "1", "alice"]
    assert len({line.index("active") for line in lines[1:]}) == 1  # aligned columns
    code, out = await run(capsys, "session", "--namespace", ns, "--json", "list")
    assert [s["sessionId"] for s in json.loads(out)["sessions"]] == [bad, good]
    code, out = await run(capsys, "session", "--namespace", ns, "show", bad, "--at", "1")
    assert code == 0 and "state: working" in out and "seq: 1" in out
    code, out = await run(capsys, "session", "--namespace", ns, "diff", bad, "1", "2")
    assert out.splitlines()[0] == "1 -> 2: working -> broken, 1 events, perfDelta 0.0"
    code, out = await run(capsys, "session", "--namespace", ns, "--json", "fork", bad, "--at", "1", "--new-id", "f1")
    assert json.loads(out)["sessionId"] == "f1" and json.loads(out)["seq"] == 1
    code, out = await run(capsys, "session", "--namespace", ns, "--json", "suspend", good)
    assert json.loads(out)["status"] == "suspended"
    code, out = await run(capsys, "session", "--namespace", ns, "list", "--status", "suspended")
    assert out.splitlines()[1].split()[:3] == ["good", "suspended", "working"]
    code, out = await run(capsys, "session", "--namespace", ns, "--json", "resume", good)
    assert json.loads(out)["status"] == "active"
    code, out = await run(capsys, "session", "--namespace", ns, "--json", "complete", good)
    assert json.loads(out)["outcome"] == "working"
    code, out = await run(capsys, "session", "--namespace", ns, "tail", bad)
    assert [line.split()[0] for line in out.splitlines()] == ["1", "2"] and out.splitlines()[1].endswith("broke")


async def test_errors_exit_1_with_the_daemon_s_message(daemon: Daemon, cli_env: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    async with rpc(daemon.port, token("alice", cli_env)) as peer:
        await peer.call("session.create", {"sessionId": "s1"})
    code = await anyio.to_thread.run_sync(main, ["session", "--namespace", cli_env, "resume", "s1"])
    assert code == 1
    assert capsys.readouterr().err.strip() == ("memento-sessions session resume: the session is active, "
                                               "not suspended (-32009)")
    code = await anyio.to_thread.run_sync(main, ["session", "--namespace", cli_env, "clear", "s1"])
    assert code == 0
    code = await anyio.to_thread.run_sync(main, ["session", "--namespace", cli_env, "show", "s1"])
    assert code == 1 and "not found (-32004)" in capsys.readouterr().err
