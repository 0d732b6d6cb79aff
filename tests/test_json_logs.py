"""MEMENTO_LOG_FORMAT=json: every line the daemon writes is one JSON object, its libraries' lines too."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.logs import configure_logging
from tests.helpers import SECRET, falkordb_url, token

pytestmark = [pytest.mark.slow, pytest.mark.topology_independent]  # logging: the same on either Redis

MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "1"}}}


class JsonDaemon:
    """`memento-sessions serve` on the session's backends with JSON logs at `level`, output to a file."""

    def __init__(self, urls: Endpoints, data_dir: Path, level: str) -> None:
        self.port = free_port()
        data_dir.mkdir(parents=True)
        env = {**os.environ, "MEMENTO_DATA_DIR": str(data_dir), "MEMENTO_PORT": str(self.port),
               "MEMENTO_LOG_FORMAT": "json", "MEMENTO_LOG_LEVEL": level, "MEMENTO_REDIS_URL": urls.redis_url,
               "MEMENTO_POSTGRES_DSN": urls.postgres_dsn or "", "MEMENTO_AUTH_SECRET": SECRET}
        graphs = falkordb_url(urls)
        if graphs:
            env["MEMENTO_FALKORDB_URL"] = graphs
        self.out = data_dir.parent / "serve.log"
        with self.out.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx2.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"not ready: {self.out.read_text()[-2000:]}")

    def stop(self) -> list[str]:
        self.proc.terminate()
        self.proc.wait(timeout=15)
        return self.out.read_text().splitlines()


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The suite's logging (tests/conftest.py) again after a test that configured its own."""
    yield
    configure_logging("console", "warning")


@pytest.fixture
def json_daemon(backend_urls: Endpoints, tmp_path: Path) -> Iterator[JsonDaemon]:
    daemon = JsonDaemon(backend_urls, tmp_path / "data", "debug")
    yield daemon
    if daemon.proc.poll() is None:
        daemon.proc.kill()
        daemon.proc.wait()


def raw_request(port: int, data: bytes, read: bool = True) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        if read:
            sock.recv(65536)


def drop_after_initialize(port: int, tok: str) -> None:
    """An MCP client that sends its initialize and goes away before the answer."""
    body = json.dumps(INITIALIZE).encode()
    head = (f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {tok}\r\n"
            f"accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        sock.sendall(head + body)


def test_every_line_of_a_json_daemon_is_one_json_object(json_daemon: JsonDaemon) -> None:
    json_daemon.wait_ready()
    tok = token("log-agent")
    raw_request(json_daemon.port, b"NOT HTTP AT ALL\r\n\r\n")  # uvicorn: invalid HTTP request
    headers = {**MCP_HEADERS, "authorization": f"Bearer {tok}"}
    with httpx2.Client(base_url=json_daemon.url, timeout=30) as http:
        assert http.post("/mcp", headers=headers, content=b"{not json").status_code == 400  # the MCP SDK's path
        opened = http.post("/mcp", headers=headers, json=INITIALIZE)
        assert opened.status_code == 200
        bad_session = {**headers, "mcp-session-id": "0" * 32}
        assert http.post("/mcp", headers=bad_session, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}
                         ).status_code == 404
    for _ in range(12):
        drop_after_initialize(json_daemon.port, tok)
    time.sleep(1.0)
    lines = json_daemon.stop()
    assert lines, "the daemon wrote nothing"
    not_json = []
    for line in lines:
        try:
            assert isinstance(json.loads(line), dict)
        except (ValueError, AssertionError):
            not_json.append(line)
    assert not_json == [], "\n".join(not_json[:40])
    records = [json.loads(line) for line in lines]
    assert any(record.get("logger_name") == "uvicorn.error" for record in records)
    assert not [record for record in records if record.get("level") in ("error", "critical")], records
    assert not any("Traceback" in line for line in lines)


def test_a_library_traceback_is_inside_its_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "info")
    try:
        raise ConnectionResetError("peer went away")
    except ConnectionResetError:
        logging.getLogger("asyncpg.pool").exception("the pool lost a connection")
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["logger_name"] == "asyncpg.pool" and record["level"] == "error"
    assert record["event"] == "the pool lost a connection"
    assert "Traceback" in record["exception"] and "ConnectionResetError: peer went away" in record["exception"]


def gone_group() -> BaseExceptionGroup[Exception]:
    try:
        raise ConnectionResetError("Connection reset by peer")
    except ConnectionResetError as reset:
        return BaseExceptionGroup("unhandled errors in a TaskGroup", [reset, BrokenPipeError(32, "Broken pipe")])


def answered_a_gone_client() -> RuntimeError:
    """What starlette raises when it tries to answer after the client went away (the cause chained)."""
    try:
        try:
            raise ConnectionResetError("Connection reset by peer")
        except ConnectionResetError:
            raise RuntimeError("Unexpected ASGI message 'http.response.start' sent, after response already "
                               "completed.") from None
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize("exc", [ConnectionResetError("Connection reset by peer"), gone_group(),
                                 answered_a_gone_client()], ids=["reset", "group", "answer-after-gone"])
def test_a_client_that_goes_away_is_one_debug_line(exc: BaseException, capsys: pytest.CaptureFixture[str]) -> None:
    """What uvicorn logs when an ASGI app raises because its client dropped (an MCP client right after connecting)."""
    for level in ("info", "debug"):
        configure_logging("json", level)
        logging.getLogger("uvicorn.error").error("Exception in ASGI application\n", exc_info=exc)
        logging.getLogger("mcp.server.streamable_http").error("Error in message router", exc_info=exc)
        lines = capsys.readouterr().err.splitlines()
        if level == "info":
            assert lines == []
            continue
        records = [json.loads(line) for line in lines]
        assert [(r["level"], r["event"], r["logger_name"]) for r in records] == [
            ("debug", "client went away", "uvicorn.error"), ("debug", "client went away", "mcp.server.streamable_http")]
        assert "Traceback" not in "".join(lines)


def test_an_error_that_is_not_a_client_going_away_keeps_its_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "info")
    logging.getLogger("uvicorn.error").error("Exception in ASGI application\n", exc_info=KeyError("boom"))
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["level"] == "error" and "KeyError: 'boom'" in record["exception"]
