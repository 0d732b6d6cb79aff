"""`memento-sessions session ...` against a running daemon: tables for people, --json for scripts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import anyio
import pytest
from anyio.streams.text import TextReceiveStream

from memento_sessions.cli import main
from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon
from tests.helpers import SECRET, make_settings, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


@pytest.fixture
def cli_env(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, namespace: str, tmp_path: Path) -> str:
    monkeypatch.chdir(tmp_path)  # not in a git work tree: `session suspend` stores no work (test_suspend_work.py)
    monkeypatch.setenv("MEMENTO_PORT", str(daemon.port))
    monkeypatch.setenv("MEMENTO_AUTH_SECRET", SECRET)
    monkeypatch.setenv("MEMENTO_DATA_DIR", str(daemon.settings.data_dir))
    monkeypatch.delenv("MEMENTO_TOKEN", raising=False)
    return namespace


def cli_lines(err: str) -> list[str]:
    """What the command wrote to stderr: the in-process daemon's JSON log lines (its health loop reports the
    backends' status whenever it gets to it, during a command too) left out."""
    return [line for line in err.strip().splitlines() if not line.startswith("{")]


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
    code, out = await run(capsys, "session", "--namespace", ns, "show", good)  # read from Postgres meanwhile
    assert code == 0 and "status: suspended" in out and "seq: 1" in out and out.splitlines()[-3].split() == [
        "start", "1"]
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
    assert cli_lines(capsys.readouterr().err) == ["memento-sessions session resume: the session is active, "
                                                  "not suspended (-32009)"]
    code = await anyio.to_thread.run_sync(main, ["session", "--namespace", cli_env, "clear", "s1"])
    assert code == 0
    code = await anyio.to_thread.run_sync(main, ["session", "--namespace", cli_env, "show", "s1"])
    assert code == 1 and "not found (-32004)" in capsys.readouterr().err


class DaemonProcess:
    """`memento-sessions serve` as a child process on the test session's servers, on a port of the test's."""

    def __init__(self, backend_urls: Endpoints, data_dir: Path, port: int) -> None:
        settings = make_settings(backend_urls, data_dir)
        self.env = {**os.environ, "MEMENTO_DATA_DIR": str(data_dir), "MEMENTO_PORT": str(port),
                    "MEMENTO_REDIS_URL": settings.redis_url or "", "MEMENTO_POSTGRES_DSN": settings.postgres_dsn or "",
                    "MEMENTO_AUTH_SECRET": SECRET, "MEMENTO_LOG_LEVEL": "warning"}
        self.env.pop("MEMENTO_TOKEN", None)
        if settings.falkordb_url:
            self.env["MEMENTO_FALKORDB_URL"] = settings.falkordb_url
        self.port, self.log_path = port, data_dir.parent / f"serve-{port}.log"

    async def start(self) -> subprocess.Popen[bytes]:
        """Start the daemon and wait (at most 60 s) until /readyz answers 200."""
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "memento_sessions.cli", "serve"], env=self.env,
                                    stdout=log, stderr=subprocess.STDOUT)
        with anyio.fail_after(60):
            while await anyio.to_thread.run_sync(ready, self.port) != 200:
                assert proc.poll() is None, self.log_path.read_text()[-3000:]
                await anyio.sleep(0.1)
        return proc


def ready(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return int(response.status)
    except (OSError, ValueError):
        return 0


async def emit(port: int, namespace: str, sid: str, count: int) -> None:
    async with rpc(port, token("alice", namespace)) as peer:
        await peer.call("event.emitBatch", {"sessionId": sid, "events": [{"type": "modified"}] * count})


@pytest.mark.slow
async def test_tail_follow_prints_every_event_once_across_a_daemon_restart(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    port = free_port()
    daemon = DaemonProcess(backend_urls, tmp_path / "data", port)
    first = await daemon.start()
    printed: list[int] = []
    try:
        async with rpc(port, token("alice", namespace)) as peer:
            sid = (await peer.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]  # seq 1
        await emit(port, namespace, sid, 2)
        argv = [sys.executable, "-m", "memento_sessions.cli", "session", "--namespace", namespace, "tail", sid, "-f"]
        async with await anyio.open_process(argv, env=daemon.env) as tail:
            assert tail.stdout is not None
            lines = TextReceiveStream(tail.stdout)

            async def read_until(seq: int) -> None:
                buffered = ""
                with anyio.fail_after(60):
                    while not printed or printed[-1] < seq:
                        buffered += await lines.receive()
                        *done, buffered = buffered.split("\n")
                        printed.extend(int(line.split()[0]) for line in done if line.strip())
                assert buffered == ""

            await read_until(3)
            await emit(port, namespace, sid, 2)
            await read_until(5)
            first.send_signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(first.wait) == 0
            second = await daemon.start()  # same port, data dir and servers
            try:
                await emit(port, namespace, sid, 3)
                await read_until(8)
                await anyio.sleep(0.5)  # anything printed twice would arrive by now
                with anyio.move_on_after(0.5):
                    printed.extend(int(line.split()[0]) for line in (await lines.receive()).splitlines() if line)
                tail.terminate()
            finally:
                second.send_signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(second.wait)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert printed == list(range(1, 9))


async def test_every_command_acts_as_memento_token(daemon: Daemon, cli_env: str, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """With MEMENTO_TOKEN set, `clear` (an admin command) acts in the token's namespace with its scopes too,
    whatever --namespace says and though the data dir's secret is at hand."""
    ns, other = cli_env, cli_env + "-b"
    async with rpc(daemon.port, token("alice", ns)) as peer:
        await peer.call("session.create", {"sessionId": "s1"})
    monkeypatch.setenv("MEMENTO_TOKEN", token("bob", other, "sessions:read sessions:write admin"))
    code = await anyio.to_thread.run_sync(main, ["session", "--namespace", ns, "clear", "s1"])
    assert code == 1 and "not found (-32004)" in capsys.readouterr().err  # team-b has no s1
    monkeypatch.setenv("MEMENTO_TOKEN", token("bob", ns))  # the right namespace, but no admin scope
    code = await anyio.to_thread.run_sync(main, ["session", "clear", "s1"])
    assert code == 1 and "admin" in capsys.readouterr().err
    monkeypatch.delenv("MEMENTO_TOKEN")
    async with rpc(daemon.port, token("alice", ns)) as peer:
        assert (await peer.call("session.get", {"sessionId": "s1"}))["session"]["sessionId"] == "s1"


async def test_options_after_the_action(daemon: Daemon, cli_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`session list --json` and `session show ID --json` (as docs/lifecycle.md shows them), as well as before."""
    ns = cli_env
    async with rpc(daemon.port, token("alice", ns)) as peer:
        await peer.call("session.create", {"sessionId": "s1"})
    code, out = await run(capsys, "session", "list", "--json", "--namespace", ns)
    assert code == 0 and [s["sessionId"] for s in json.loads(out)["sessions"]] == ["s1"]
    code, out = await run(capsys, "session", "show", "s1", "--json", "--namespace", ns)
    assert code == 0 and json.loads(out)["session"]["status"] == "active"
    code, out = await run(capsys, "session", "--namespace", ns, "--json", "show", "s1")
    assert code == 0 and json.loads(out)["session"]["sessionId"] == "s1"
    code, out = await run(capsys, "session", "--namespace", "elsewhere", "list", "--namespace", ns)
    assert code == 0 and out.splitlines()[1].split()[:2] == ["s1", "active"]  # the later one wins


async def test_a_reader_that_goes_away_ends_the_command_quietly(daemon: Daemon, cli_env: str) -> None:
    """`session list | head -1`: the pipe breaks under the command, which exits 141 (as a shell reports a
    SIGPIPE) and says nothing, rather than "cannot connect: [Errno 32] Broken pipe" and 1."""
    async with rpc(daemon.port, token("alice", cli_env)) as peer:
        for n in range(500):  # a table larger than a pipe's buffer (64 KiB)
            await peer.call("session.create", {"sessionId": f"s{n:03d}-{'x' * 120}"})
    env = {**os.environ, "MEMENTO_AUTH_SECRET": SECRET, "MEMENTO_DATA_DIR": str(daemon.settings.data_dir)}
    env.pop("MEMENTO_TOKEN", None)
    shell = f"{sys.executable} -m memento_sessions.cli session list --limit 500 --namespace {cli_env} | head -1; " \
            "echo \"${PIPESTATUS[0]}\" >&2"
    done = await anyio.run_process(["bash", "-c", shell], env=env, check=False)
    status = done.stderr.decode().strip().splitlines()
    assert done.stdout.decode().split() == ["SESSIONID", "STATUS", "STATE", "SEQ", "AGENTS", "UPDATEDAT"]
    assert status == ["141"] or status == ["0"], status  # nothing else on stderr
