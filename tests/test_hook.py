"""`memento-sessions hook` as Claude Code runs it: a process per hook input, silent, exit 0, spooling while
the daemon is down and delivering later in order, exactly once, across a daemon restart."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote as urllib_quote
from urllib.parse import urlsplit

import anyio
import pytest

from memento_sessions.cli.wire import Wire, WireError, quote, split_url
from memento_sessions.client import Client
from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio
HOOK = [str(Path(sys.executable).with_name("memento-sessions")), "hook"]


def hook_input(sid: str, n: int, cwd: str = "/repo") -> dict[str, Any]:
    """PreToolUse and PostToolUse of an Edit, alternating (n even: pre, odd: post of the same tool use)."""
    base = {"session_id": sid, "transcript_path": "/tmp/t.jsonl", "cwd": cwd, "tool_name": "Edit",
            "tool_use_id": f"toolu_{n // 2:04d}", "tool_input": {"file_path": f"{cwd}/src/f{n // 2}.py",
                                                                 "old_string": "a", "new_string": "b"}}
    if n % 2 == 0:
        return {**base, "hook_event_name": "PreToolUse"}
    return {**base, "hook_event_name": "PostToolUse", "tool_response": {"filePath": f"{cwd}/src/f{n // 2}.py"}}


def run_hook(env: dict[str, str], record: Any | None, *args: str) -> subprocess.CompletedProcess[bytes]:
    stdin = b"" if record is None else (record if isinstance(record, bytes) else json.dumps(record).encode())
    return subprocess.run([*HOOK, *args], input=stdin, env=env, capture_output=True, timeout=30, check=False)


def hook_env(data_dir: Path, namespace: str, port: int) -> dict[str, str]:
    return {**os.environ, "MEMENTO_DATA_DIR": str(data_dir), "MEMENTO_TOKEN": token("claude", namespace),
            "MEMENTO_URL": f"ws://127.0.0.1:{port}/ws"}


async def stored(port: int, namespace: str, sid: str) -> list[dict[str, Any]]:
    async with Client(f"ws://127.0.0.1:{port}/ws", token("reader", namespace), reconnect=False) as client:
        return [event async for event in client.iter_events(sid)]


async def test_spools_while_the_daemon_is_down_then_delivers_in_order_exactly_once(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    down = hook_env(tmp_path, namespace, free_port())
    for n in range(6):  # the daemon is not running: each call is silent, exits 0, and spools
        done = await anyio.to_thread.run_sync(run_hook, down, hook_input("claude-1", n))
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    spool = tmp_path / "hook-spool" / "spool.jsonl"
    assert len(spool.read_text().splitlines()) == 6
    settings = make_settings(backend_urls, tmp_path / "d", port=free_port())
    async with running(settings) as daemon:
        up = hook_env(tmp_path, namespace, daemon.port)
        done = await anyio.to_thread.run_sync(run_hook, up, hook_input("claude-1", 6))
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
        # That call delivered the backlog within its time budget; on a slow machine the rest goes with the
        # next call, as --flush does here (exit 0: nothing left).
        assert (await anyio.to_thread.run_sync(run_hook, up, None, "--flush")).returncode == 0
        first = await stored(daemon.port, namespace, "claude-1")
    # 7 inputs: 4 PreToolUse (a pending tool_use block each) and 3 PostToolUse (the block completed and a
    # `modified` for its file each): 4 + 3 * 2 = 10 events, in the order the hooks ran.
    assert len(first) == 10 and [event["seq"] for event in first] == list(range(1, 11))
    assert [event["id"] for event in first][:3] == ["toolu_0000:use", "toolu_0000:result", "toolu_0000:modified"]
    modified = [event["changeInfo"]["entityIds"] for event in first if event["type"] == "modified"]
    assert modified == [["file:src/f0.py"], ["file:src/f1.py"], ["file:src/f2.py"]]
    assert spool.read_text() == ""  # everything delivered: the spool is emptied
    assert {path.name: path.stat().st_mode & 0o777 for path in spool.parent.glob("spool.*")} == {
        "spool.jsonl": 0o600, "spool.offset": 0o600}  # owner-only, as everything in the data dir
    # The daemon goes away again: two more inputs spool; after its restart one call delivers both, and a
    # replayed old spool (a crash before the offset was committed) writes nothing twice.
    for n in (7, 8):
        assert (await anyio.to_thread.run_sync(run_hook, down, hook_input("claude-1", n))).returncode == 0
    backlog = spool.read_text()
    async with running(settings) as daemon:
        up = hook_env(tmp_path, namespace, daemon.port)
        (tmp_path / "hook-spool" / "spool.offset").write_text("0")
        spool.write_text(backlog)
        assert (await anyio.to_thread.run_sync(run_hook, up, None, "--flush")).returncode == 0
        spool.write_text(backlog)  # delivered once more: the same ids, nothing new
        (tmp_path / "hook-spool" / "spool.offset").write_text("0")
        assert (await anyio.to_thread.run_sync(run_hook, up, None, "--flush")).returncode == 0
        after = await stored(daemon.port, namespace, "claude-1")
    assert [event["seq"] for event in after] == list(range(1, 14))  # 10 + PostToolUse (2) + PreToolUse (1)
    assert [event["id"] for event in after[10:]] == ["toolu_0003:result", "toolu_0003:modified", "toolu_0004:use"]


async def test_bad_input_or_no_token_is_silent_and_exit_0(tmp_path: Path, namespace: str) -> None:
    env = hook_env(tmp_path, namespace, free_port())
    for stdin in (b"", b"{truncated", b"[1,2]", b"\xff\xfe"):
        done = await anyio.to_thread.run_sync(run_hook, env, stdin)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    no_token = {key: value for key, value in env.items() if key != "MEMENTO_TOKEN"}
    done = await anyio.to_thread.run_sync(run_hook, no_token, hook_input("claude-2", 0))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert len((tmp_path / "hook-spool" / "spool.jsonl").read_text().splitlines()) == 1  # only the input
    # --flush with the daemon down: the input is still there, and the exit code says so (the console script
    # ends with os._exit, which must carry the code).
    done = await anyio.to_thread.run_sync(run_hook, env, None, "--flush")
    assert (done.returncode, done.stdout, done.stderr) == (1, b"", b"")


def test_the_hook_imports_nothing_heavy(tmp_path: Path, namespace: str) -> None:
    """What makes the hook fast is what it does not import: no pydantic (settings), anyio, websockets, JWT,
    structlog, the async client, argparse, dataclasses (inspect), datetime or hashlib (OpenSSL) for an edit,
    nor the socket module (its enums), the idna codec (getaddrinfo with a str host), base64 or struct;
    while spooling only (no token to deliver with), not even typing, the converters or `_socket`."""
    heavy = {"pydantic", "pydantic_settings", "anyio", "websockets", "jwt", "structlog", "redis", "argparse",
             "dataclasses", "datetime", "hashlib", "memento_sessions.settings", "memento_sessions.client",
             "memento_sessions.auth", "socket", "encodings.idna", "base64", "struct"}
    env = {**hook_env(tmp_path, namespace, free_port()), "PYTHONPROFILEIMPORTTIME": "1"}
    spooling = {key: value for key, value in env.items() if key != "MEMENTO_TOKEN"}  # nothing to deliver with
    only_spooling = heavy | {"memento_sessions.ingest.claude_hooks", "_socket", "typing"}
    for variables, lean in ((env, heavy), (spooling, only_spooling)):
        done = run_hook(variables, hook_input("claude-3", 0))
        imported = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines() if "|" in line}
        assert done.returncode == 0 and "memento_sessions.cli.hook" in imported
        assert imported & lean == set()


def test_the_hook_process_costs_little_beyond_the_interpreter(tmp_path: Path, namespace: str) -> None:
    env = {key: value for key, value in hook_env(tmp_path, namespace, free_port()).items() if key != "MEMENTO_TOKEN"}

    def median(command: list[str], stdin: bytes) -> float:
        times = []
        for _ in range(9):
            started = time.perf_counter()
            subprocess.run(command, input=stdin, env=env, capture_output=True, timeout=30, check=True)
            times.append(time.perf_counter() - started)
        return sorted(times)[4]

    bare = median([sys.executable, "-c", "pass"], b"")
    hook = median(HOOK, json.dumps(hook_input("claude-3", 0)).encode())
    # The bench measures the p99 against 100 ms; here, on a machine shared with other test runs, only that
    # the hook adds little to the interpreter's own start (it took ~20 ms on a quiet machine).
    assert hook - bare < 0.1, (hook, bare)


def test_the_wire_reads_a_url_and_quotes_a_token_as_urllib_does() -> None:
    """cli/wire.py parses MEMENTO_URL and quotes the token itself (urllib.parse pulls ipaddress into the hook):
    the same host, port and path as urlsplit, the same text as quote."""
    for url in ("ws://127.0.0.1:8765/ws", "wss://memento.example.com/ws", "ws://[::1]:9000/x/ws?a=1#f",
                "ws://user:pw@host:81", "WSS://Host.example/", "ws://localhost:1"):
        parts = urlsplit(url)
        expected = (parts.scheme == "wss", parts.hostname or "127.0.0.1",
                    parts.port or (443 if parts.scheme == "wss" else 80), parts.path or "/ws")
        secure, host, port, path = split_url(url)
        assert (secure, host.lower(), port, path) == expected, url
    with pytest.raises(WireError):  # a bad port is the daemon not reachable: the input stays spooled
        split_url("ws://127.0.0.1:notaport/ws")
    for text in ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjIn0.c2ln-_", "a b+c/d?e=f&g%h", "é∂"):
        assert quote(text) == urllib_quote(text)


def test_a_wss_url_speaks_tls() -> None:
    """wss:// wraps the `_socket` connection in TLS: what reaches the server is a TLS ClientHello (a
    handshake record, 0x16 0x03), and a server that closes makes a WireError, not another exception."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        failure: list[BaseException] = []

        def client() -> None:
            try:
                Wire(f"wss://127.0.0.1:{port}/ws", "token", time.monotonic() + 5)
            except BaseException as exc:  # checked below, whatever it is
                failure.append(exc)

        thread = threading.Thread(target=client)
        thread.start()
        conn, _ = server.accept()
        with conn:
            first = conn.recv(3)
        thread.join(10)
    assert first[:2] == b"\x16\x03"
    assert len(failure) == 1 and isinstance(failure[0], WireError)


async def test_a_suspended_session_is_resumed_not_created_again(daemon: Daemon, tmp_path: Path,
                                                                 namespace: str) -> None:
    """`session suspend`, then the Claude session goes on (claude --resume): the hook brings the suspended
    session back with its events and seqs; a new session of that id would shadow them."""
    env = hook_env(tmp_path, namespace, daemon.port)
    for n in range(2):
        assert (await anyio.to_thread.run_sync(run_hook, env, hook_input("claude-s", n))).returncode == 0
    before = await stored(daemon.port, namespace, "claude-s")
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        assert (await peer.call("session.suspend", {"sessionId": "claude-s"}))["status"] == "suspended"
        for n in range(2, 4):
            assert (await anyio.to_thread.run_sync(run_hook, env, hook_input("claude-s", n))).returncode == 0
        assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
        session = (await peer.call("session.get", {"sessionId": "claude-s"}))["session"]
    after = await stored(daemon.port, namespace, "claude-s")
    assert len(before) == 3 and session["status"] == "active"
    assert after[:3] == before  # the first events are still there, with their seqs
    assert [event["seq"] for event in after] == list(range(1, 7))  # and the new ones follow: 3 + 3
    assert [event["id"] for event in after[3:]] == ["toolu_0001:use", "toolu_0001:result", "toolu_0001:modified"]


async def test_a_completed_session_sets_the_input_aside_and_the_spool_moves_on(daemon: Daemon, tmp_path: Path,
                                                                                namespace: str) -> None:
    # No claims: claude-c's edit would lease src/f0.py, and claude-d's edit of it would add a conflict event.
    env = {**hook_env(tmp_path, namespace, daemon.port), "MEMENTO_HOOK_CLAIM_TTL": "0"}
    assert (await anyio.to_thread.run_sync(run_hook, env, hook_input("claude-c", 0))).returncode == 0
    # stored before the session completes, even when the call ran past its budget (a loaded host)
    assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.checkpoint", {"sessionId": "claude-c", "final": True})
    for sid in ("claude-c", "claude-d"):
        assert (await anyio.to_thread.run_sync(run_hook, env, hook_input(sid, 1))).returncode == 0
    assert (await anyio.to_thread.run_sync(run_hook, env, None, "--flush")).returncode == 0  # nothing left
    rejected = [json.loads(line) for line in (tmp_path / "hook-spool" / "rejected.jsonl").read_text().splitlines()]
    assert [(entry["input"]["session_id"], entry["error"]) for entry in rejected] == [
        ("claude-c", "session is completed (-32009)")]
    assert len(await stored(daemon.port, namespace, "claude-d")) == 2  # the next input was delivered


def spooled_line(sid: str, n: int, pad: int) -> str:
    """One spool line as the hook writes it: an input of about `pad` bytes, when it was read, the root."""
    record = hook_input(sid, n)
    record["tool_input"]["new_string"] = "x" * pad
    return json.dumps({"at": f"2026-01-01T00:00:00.{n:06d}Z", "root": "/repo", "input": record}) + "\n"


def measured_hook(env: dict[str, str], record: Any | None, *args: str) -> tuple[float, int, bytes]:
    """One hook process: (seconds, its peak RSS in MB, its stderr)."""
    code = ("import sys\nfrom memento_sessions.cli import main\ncode = main(sys.argv[1:])\n"  # VmHWM: this process's
            "print(next(line for line in open('/proc/self/status') if line.startswith('VmHWM')).split()[1])\n"
            "sys.exit(code)")  # (ru_maxrss would carry the forking pytest's across exec)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, "hook", *args], env=env, capture_output=True, timeout=60,
                          check=False, input=b"" if record is None else json.dumps(record).encode())
    assert done.returncode == 0, done.stderr
    return time.perf_counter() - started, int(done.stdout) // 1024, done.stderr


async def test_a_large_backlog_goes_out_in_chunks_within_each_call_s_budget(daemon: Daemon, tmp_path: Path,
                                                                            namespace: str) -> None:
    """24 MB of spooled inputs (3,000 of 8 KB): each hook call delivers a part of it, in about its 150 ms
    budget and in memory that does not grow with the backlog (it read all of it: +32 MB here; at 100 MB the
    reading alone outlasted the budget and nothing was delivered)."""
    folder = tmp_path / "hook-spool"
    folder.mkdir()
    lines = [spooled_line("claude-b", n, 8000) for n in range(3000)]
    (folder / "spool.jsonl").write_text("".join(lines))
    env = hook_env(tmp_path, namespace, daemon.port)
    bare = await anyio.to_thread.run_sync(measured_hook, env, None)  # no input: reads nothing
    offsets = [0]
    for n in range(3000, 3005):
        seconds, rss, err = await anyio.to_thread.run_sync(measured_hook, env, hook_input("claude-b", n))
        offset = folder / "spool.offset"  # written at the first delivery: none yet when no call delivered
        offsets.append(int(offset.read_text()) if offset.exists() else 0)
        assert err == b""
        assert seconds < bare[0] + 2.0, (seconds, bare)  # the budget is 0.15 s; slack for a shared host
        assert rss < bare[1] + 16, (rss, bare)  # MB beyond a hook that reads nothing: a chunk, not 24 MB
    # Each call delivered a part, in order (on a host so loaded that a call's interpreter start eats its whole
    # budget, that call delivers nothing: three of five must have).
    advanced = [after > before for before, after in itertools.pairwise(offsets)]
    assert offsets == sorted(offsets) and offsets[-1] < (folder / "spool.jsonl").stat().st_size
    assert sum(advanced) >= 3, offsets
    delivered = await stored(daemon.port, namespace, "claude-b")
    assert delivered[0]["id"] == "toolu_0000:use"
    assert [event["seq"] for event in delivered] == list(range(1, len(delivered) + 1))


async def test_the_spool_is_capped_oldest_dropped_counted_and_said_once(backend_urls: Endpoints, tmp_path: Path,
                                                                         namespace: str) -> None:
    folder = tmp_path / "hook-spool"
    folder.mkdir()
    (folder / "spool.jsonl").write_text("".join(spooled_line("claude-k", n, 8000) for n in range(400)))  # 3.2 MB
    down = {**hook_env(tmp_path, namespace, free_port()), "MEMENTO_HOOK_SPOOL_MAX_BYTES": str(1024 * 1024)}
    done = await anyio.to_thread.run_sync(run_hook, down, hook_input("claude-k", 400))
    kept = (folder / "spool.jsonl").read_text().splitlines()
    dropped = 401 - len(kept)
    assert done.returncode == 0 and done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        f"memento-sessions hook: more than 1048576 bytes spooled and not delivered: dropped the {dropped} oldest "
        f"inputs ({dropped} in all; MEMENTO_HOOK_SPOOL_MAX_BYTES sets the cap)"]
    assert (folder / "spool.jsonl").stat().st_size <= 512 * 1024 and 50 <= len(kept) < 70  # the newest half
    assert [json.loads(line)["input"]["tool_use_id"] for line in kept[-2:]] == ["toolu_0199", "toolu_0200"]
    assert (folder / "dropped").read_text() == str(dropped)
    done = await anyio.to_thread.run_sync(run_hook, down, hook_input("claude-k", 401))
    assert (done.returncode, done.stderr) == (0, b"")  # said once: nothing more was dropped
    settings = make_settings(backend_urls, tmp_path / "d", port=free_port())
    async with running(settings) as daemon:
        up = {**down, "MEMENTO_URL": f"ws://127.0.0.1:{daemon.port}/ws"}
        assert (await anyio.to_thread.run_sync(run_hook, up, None, "--flush")).returncode == 0
        delivered = await stored(daemon.port, namespace, "claude-k")
    first = json.loads(kept[0])["input"]
    assert delivered[0]["id"].startswith(first["tool_use_id"])  # the kept inputs, from the oldest kept
    assert delivered[-1]["id"] == "toolu_0200:modified" and len(delivered) == (len(kept) + 1) * 3 // 2
