"""The real `memento-sessions serve` process: embedded servers, supervision, signals, data reuse."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import redis

from memento_sessions.embedded.process import free_port

pytestmark = pytest.mark.slow


def readyz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    except OSError:
        return 0, {}


def wait_for(serve: Serve, status: int, timeout: float) -> float:
    """Seconds until /readyz answers `status`; fails after `timeout`, or at once if the daemon exited,
    with the end of its log in the message."""
    start = time.monotonic()
    while time.monotonic() - start < timeout and serve.proc.poll() is None:
        if readyz(serve.port)[0] == status:
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"/readyz did not answer {status} within {timeout}s: {readyz(serve.port)}; "
                         f"exit code {serve.proc.poll()}; log ends:\n{serve.log_tail()}")


class Serve:
    """One `memento-sessions serve` child with its own data dir and port."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        env = {**os.environ, "MEMENTO_DATA_DIR": str(data_dir), "MEMENTO_PORT": str(self.port),
               "MEMENTO_LOG_FORMAT": "json"}
        for name in ("MEMENTO_REDIS_URL", "MEMENTO_POSTGRES_DSN", "MEMENTO_AUTH_SECRET"):
            env.pop(name, None)
        self.log = open(data_dir.parent / f"serve-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def log_tail(self, lines: int = 30) -> str:
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])

    def pid_of(self, server: str) -> int:
        path = self.data_dir / ("redis/redis.pid" if server == "redis" else "postgres/pgdata/postmaster.pid")
        return int(path.read_text().split()[0])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=10)
        self.log.close()
        return code


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    daemon = Serve(tmp_path / "data")
    yield daemon
    if daemon.proc.poll() is None:
        daemon.proc.kill()
        daemon.proc.wait()
    daemon.log.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def runtime(serve: Serve) -> dict[str, str]:
    data: dict[str, str] = json.loads((serve.data_dir / "runtime.json").read_text())
    return data


def emit_over_ws(serve: Serve, session_id: str | None) -> tuple[str, int]:
    """Create a session (when None) and emit one event into it, over the daemon's WebSocket."""
    import anyio

    from memento_sessions.auth import issue_token
    from memento_sessions.embedded.datadir import auth_secret
    from tests.rpcsocket import rpc

    async def go() -> tuple[str, int]:
        tok = issue_token(auth_secret(serve.data_dir), "agent-r")
        async with rpc(serve.port, tok) as peer:
            sid = session_id or (await peer.call("session.create", {}))["sessionId"]
            seq = (await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}}))["seq"]
            return sid, seq

    return anyio.run(go)


def assert_locked_down(data_dir: Path, urls: dict[str, str]) -> None:
    """Nothing in the data dir is open to other users; the servers want the passwords the URLs carry."""
    opened = {str(path): oct(path.lstat().st_mode & 0o777) for path in [data_dir, *data_dir.rglob("*")]
              if path.lstat().st_mode & 0o077}
    assert opened == {}
    assert (data_dir / "runtime.json").stat().st_mode & 0o777 == 0o600
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(urls["redis_url"].replace(f":{(data_dir / 'redis/password').read_text()}@", "")).ping()
    assert f":{(data_dir / 'postgres/password').read_text()}@127.0.0.1:" in urls["postgres_dsn"]


def test_readyz_follows_a_killed_embedded_redis(serve: Serve) -> None:
    wait_for(serve, 200, 60)
    session_id, seq = emit_over_ws(serve, None)
    assert seq == 1
    time.sleep(1.2)  # AOF is fsynced every second: the event is on disk before the kill
    os.kill(serve.pid_of("redis"), signal.SIGKILL)
    went_down = wait_for(serve, 503, 1.0)
    status, body = readyz(serve.port)
    assert status == 503 and body["backends"]["redis"] == "down"  # type: ignore[index]
    assert went_down < 1.0
    wait_for(serve, 200, 15)
    assert redis.Redis.from_url(runtime(serve)["redis_url"]).ping()
    # the daemon's own connections (Function calls, pub/sub) came back too, and the history survived
    assert emit_over_ws(serve, session_id) == (session_id, 2)
    assert serve.stop() == 0


def test_sigterm_stops_everything_and_a_restart_reuses_the_data(serve: Serve, tmp_path: Path) -> None:
    wait_for(serve, 200, 60)
    urls = runtime(serve)
    redis.Redis.from_url(urls["redis_url"]).set("kept", "yes")
    import anyio

    async def create_table() -> None:
        conn = await asyncpg.connect(urls["postgres_dsn"])
        await conn.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('yes')")
        await conn.close()

    anyio.run(create_table)
    pids = [serve.pid_of("redis"), serve.pid_of("postgres")]
    assert_locked_down(serve.data_dir, urls)

    second = Serve(serve.data_dir)
    assert second.proc.wait(timeout=60) == 2
    second.log.close()  # left open, it was an unraisable ResourceWarning failing a later test under -W error
    assert "is in use by another memento-sessions daemon" in (tmp_path / f"serve-{second.port}.log").read_text()
    assert readyz(serve.port)[0] == 200, "the second daemon disturbed the first"

    started = time.monotonic()
    assert serve.stop() == 0
    assert time.monotonic() - started < 10
    assert not any(alive(pid) for pid in pids), "an embedded server outlived the daemon"

    again = Serve(serve.data_dir)
    try:
        assert wait_for(again, 200, 10) < 10  # mostly imports (CPU): 3 s idle, up to 8 s on a busy 2-core box
        urls = runtime(again)
        assert redis.Redis.from_url(urls["redis_url"]).get("kept") == b"yes"

        async def read_table() -> str:
            conn = await asyncpg.connect(urls["postgres_dsn"])
            value: str = await conn.fetchval("SELECT v FROM kept")
            await conn.close()
            return value

        assert anyio.run(read_table) == "yes"
    finally:
        assert again.stop() == 0
