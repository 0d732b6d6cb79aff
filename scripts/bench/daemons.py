"""Daemon processes on the run's servers, and what the scale sections read of them from /proc.

The driver starts the one every section talks to; `scale.cross_daemon` starts a second on the same
servers. CPU seconds and RSS come from /proc/<pid>, so a figure counts the daemon's own work only.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from bench.harness import SECRET
from memento_sessions.embedded.process import free_port

# The scale sections open 10,000 WebSocket connections to one daemon: its cap (default 10,000) raised for
# the bench only, with room for the bench's own connections. The product's default stays.
MAX_CONNECTIONS = 12_000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True)
class Daemon:
    """A running daemon process: where it listens and its pid."""

    port: int
    pid: int


@asynccontextmanager
async def daemon(redis_url: str, postgres_dsn: str, data: Path, *, falkordb_url: str) -> AsyncIterator[Daemon]:
    """A daemon process on the servers (the sessions' Redis, the graphs' own redis-server, Postgres), its data
    in `data`/daemon; stopped on exit."""
    port = free_port()
    env = {**os.environ, "MEMENTO_REDIS_URL": redis_url, "MEMENTO_FALKORDB_URL": falkordb_url,
           "MEMENTO_POSTGRES_DSN": postgres_dsn,
           "MEMENTO_AUTH_SECRET": SECRET, "MEMENTO_PORT": str(port), "MEMENTO_DATA_DIR": str(data / "daemon"),
           "MEMENTO_LOG_LEVEL": "warning", "MEMENTO_CHECKPOINT_EVERY": "100000",
           "MEMENTO_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}
    proc = subprocess.Popen([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env)
    try:
        await wait_port(port)
        yield Daemon(port, proc.pid)
    finally:
        proc.terminate()
        proc.wait(15)


async def wait_port(port: int) -> None:
    """Until something accepts connections on `port` (up to 60 s)."""
    with anyio.fail_after(60):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
                await stream.aclose()
                return
            except OSError:
                await anyio.sleep(0.1)


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit (children inherit it); the new limit.

    10,000 connections need 10,000 descriptors in the daemon and as many in the clients' process.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds `pid` has used so far (/proc/<pid>/stat utime + stime)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_kb(pid: int) -> int:
    """Resident set size of `pid` in KB (/proc/<pid>/statm)."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB
