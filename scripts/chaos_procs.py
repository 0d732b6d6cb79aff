"""The processes of a chaos run: one Redis (+FalkorDB), one Postgres, and daemons, all on loopback.

Redis is the embedded server the daemon itself would start, with its own data dir and port kept across
restarts (a SIGTERM or SIGKILL, then a start on the same port and AOF). Its `appendfsync` is the run's
choice: `always` makes every acknowledged write durable before the reply; with `everysec` (the daemon's
own embedded default) a write reaches the kernel before the reply but is fsynced up to a second later.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

import redis
from chaos_cluster import ChaosCluster

from memento_sessions.embedded.postgres import EmbeddedPostgres
from memento_sessions.embedded.process import free_port
from memento_sessions.embedded.redis import EmbeddedRedis

_PR_SET_PDEATHSIG = 1


def die_with_us() -> None:
    """preexec_fn: a daemon child gets SIGTERM when the chaos script dies, however it dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChaosRedis(EmbeddedRedis):
    """The embedded Redis with the run's appendfsync policy (a later argument wins over earlier ones)."""

    def __init__(self, directory: Path, fsync: str) -> None:
        super().__init__(directory)
        self.fsync = fsync

    def argv(self) -> list[str]:
        return [*super().argv(), "--appendfsync", self.fsync]

    def client(self) -> redis.Redis:
        """A synchronous client over loopback TCP (the daemons use the same URL); replies decoded."""
        return redis.Redis.from_url(self.tcp_url, socket_timeout=10, decode_responses=True)

    def client_for(self, key: str) -> redis.Redis:
        """The client of the server that holds `key`: the one server."""
        return self.client()

    def kill_pubsub(self) -> int:
        return int(self.client().client_kill_filter(_type="pubsub"))

    def env(self) -> dict[str, str]:
        """What the daemons need besides the Redis URL: nothing (FalkorDB is this server)."""
        return {}

    def kill(self, sig: int) -> None:
        """Send `sig` and wait for the process to end (a SIGTERM lets Redis fsync the AOF and exit)."""
        proc = self.proc
        if proc is None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def applied_fsync(self) -> str:
        """The appendfsync Redis runs with, as it reports it."""
        reply: dict[str, str] = self.client().config_get("appendfsync")  # type: ignore[assignment]
        return reply.get("appendfsync", "?")


class DaemonProc:
    """One `python -m memento_sessions.cli serve` child on a fixed port, killed and restarted at will."""

    def __init__(self, name: str, workdir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.data_dir = workdir / name
        self.env = {**os.environ, **env, "MEMENTO_PORT": str(self.port), "MEMENTO_DATA_DIR": str(self.data_dir),
                    "MEMENTO_LOG_FORMAT": "json", "MEMENTO_LOG_LEVEL": "warning"}
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self) -> None:
        """Start the child (the log file is appended to across restarts)."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept open while the child runs
        self.proc = subprocess.Popen([sys.executable, "-m", "memento_sessions.cli", "serve"], env=self.env,
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=die_with_us)

    def ready(self) -> bool:
        """/readyz answers 200."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float) -> float:
        """Seconds until ready; raises RuntimeError (with the log's end) if it exits or takes too long."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ready():
                return time.monotonic() - start
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready within {timeout}s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no goodbye to clients, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if self._log is not None:
            self._log.close()

    def stop(self) -> int | None:
        """SIGTERM and wait (the exit code; None when it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        if self._log is not None:
            self._log.close()
        return code

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def logged_errors(self) -> list[str]:
        """Log lines at error level or with a traceback (the daemon logs one JSON object a line)."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                if "Traceback" in line:
                    found.append(line)
                continue
            if isinstance(entry, dict) and (entry.get("level") in ("error", "critical") or "exception" in entry):
                found.append(line)
        return found


def start_backends(workdir: Path, fsync: str, cluster: bool = False) -> tuple[ChaosRedis | ChaosCluster,
                                                                             EmbeddedPostgres]:
    """Redis (+FalkorDB), or a Redis Cluster and a FalkorDB, and Postgres under `workdir`, on loopback ports."""
    server: ChaosRedis | ChaosCluster = ChaosCluster(workdir) if cluster else ChaosRedis(workdir / "redis", fsync)
    server.start()
    postgres = EmbeddedPostgres(workdir / "postgres")
    postgres.start()
    return server, postgres
