"""Every command finds the daemon by one rule: the data dir's runtime.json (which a running daemon writes in
every mode), else MEMENTO_URL, else MEMENTO_HOST / MEMENTO_PORT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from memento_sessions.cli import main
from memento_sessions.cli.wire import daemon_url
from memento_sessions.client import Client
from memento_sessions.embedded.process import free_port
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.settings import Settings
from tests.helpers import token

pytestmark = pytest.mark.anyio
CLI = [sys.executable, "-m", "memento_sessions.cli"]


def test_the_rule_runtime_json_then_memento_url_then_host_and_port(tmp_path: Path) -> None:
    assert daemon_url(str(tmp_path), None, None, None) == "ws://127.0.0.1:8765/ws"  # the settings' defaults
    assert daemon_url(str(tmp_path), None, "10.1.2.3", "9001") == "ws://10.1.2.3:9001/ws"
    assert daemon_url(str(tmp_path), "wss://far.example/ws", "10.1.2.3", 9001) == "wss://far.example/ws"
    (tmp_path / "runtime.json").write_text(json.dumps({"host": "0.0.0.0", "port": 4711, "pid": 1}))
    assert daemon_url(str(tmp_path), "wss://far.example/ws", "10.1.2.3", 9001) == "ws://127.0.0.1:4711/ws"
    (tmp_path / "runtime.json").write_text(json.dumps({"host": "::1", "port": 4712}))
    assert daemon_url(str(tmp_path), None, None, None) == "ws://[::1]:4712/ws"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    (tmp_path / "runtime.json").write_text(json.dumps({"port": 4713, "pid": int(gone.stdout)}))
    assert daemon_url(str(tmp_path), "ws://h:1/ws", None, None) == "ws://h:1/ws"  # left by a daemon killed -9
    (tmp_path / "runtime.json").write_text("{torn")  # a file being replaced: the next rule
    assert daemon_url(str(tmp_path), "ws://h:1/ws", None, None) == "ws://h:1/ws"


async def test_a_daemon_on_configured_servers_is_found_by_hook_ingest_and_session(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert settings.redis_url and settings.postgres_dsn  # no embedded servers: the daemon owns no backend URL
    runtime = settings.data_dir / "runtime.json"
    async with running(settings) as daemon:
        written = json.loads(runtime.read_text())
        assert written == {"host": "127.0.0.1", "port": daemon.port, "pid": os.getpid()}
        assert runtime.stat().st_mode & 0o777 == 0o600
        env = {**{k: v for k, v in os.environ.items() if k not in ("MEMENTO_URL", "MEMENTO_PORT", "MEMENTO_HOST")},
               "MEMENTO_DATA_DIR": str(settings.data_dir), "MEMENTO_TOKEN": token("claude", namespace),
               "MEMENTO_PORT": str(free_port())}  # a wrong port: runtime.json comes first
        hook_input = {"session_id": "hooked", "hook_event_name": "UserPromptSubmit", "prompt": "hi", "cwd": "/r"}
        done = await anyio.run_process([*CLI, "hook"], input=json.dumps(hook_input).encode(), env=env, check=False)
        assert done.returncode == 0
        # what the call left past its 0.15 s budget (a loaded host) --flush delivers, to the same daemon: exit 0
        # only when nothing is left, which a wrong port could not give
        done = await anyio.run_process([*CLI, "hook", "--flush"], env=env, check=False)
        assert done.returncode == 0, done.stderr.decode()
        transcript = tmp_path / "t.jsonl"
        transcript.write_text(json.dumps(hook_input) + "\n")
        done = await anyio.run_process([*CLI, "ingest", str(transcript), "--format", "hook", "--session", "ingested"],
                                       env=env, check=False)
        assert done.returncode == 0, done.stderr.decode()
        for name, value in env.items():
            if name.startswith("MEMENTO_"):
                monkeypatch.setenv(name, value)
        monkeypatch.delenv("MEMENTO_TOKEN")
        monkeypatch.setenv("MEMENTO_AUTH_SECRET", settings.auth_secret or "")
        capsys.readouterr()
        code = await anyio.to_thread.run_sync(main, ["session", "list", "--json", "--namespace", namespace])
        listed = sorted(s["sessionId"] for s in json.loads(capsys.readouterr().out)["sessions"])
        assert code == 0 and listed == ["hooked", "ingested"]
        delivered = await seqs(daemon, namespace, "hooked")
        assert delivered and delivered == list(range(1, len(delivered) + 1))
    assert not runtime.exists()  # removed at stop


async def seqs(daemon: Daemon, namespace: str, sid: str) -> list[int]:
    async with Client(f"ws://127.0.0.1:{daemon.port}/ws", token("reader", namespace), reconnect=False) as client:
        return [int(event["seq"]) async for event in client.iter_events(sid)]
