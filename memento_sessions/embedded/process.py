"""A supervised child server: started, probed until it answers, restarted with backoff if it dies."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import anyio

from memento_sessions.embedded.datadir import private_dir
from memento_sessions.errors import EmbeddedStartError as EmbeddedStartError  # defined in errors; name kept
from memento_sessions.logs import get_logger
from memento_sessions.metrics import EMBEDDED_RESTARTS

log = get_logger(__name__)
_PR_SET_PDEATHSIG = 1
START_TIMEOUT = 60.0
CHILD_UMASK = 0o077  # every file a server creates (AOF, WAL, logs) is for the data dir's owner only


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent(sig: int) -> Callable[[], None]:
    """preexec_fn: the child gets `sig` when the daemon dies, even by SIGKILL."""

    def set_pdeathsig() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)

    return set_pdeathsig


def kill_orphan(pid_file: Path, binary: str) -> None:
    """Stop a server left behind by a daemon that died (we hold the data dir lock, so it is ours)."""
    try:
        pid = int(pid_file.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return
    if binary.encode() not in cmdline:
        return
    log.warning("stopping orphaned server", pid=pid, binary=binary)
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.05)


def as_user(user: str | None) -> dict[str, Any]:
    """Popen arguments that run the child as `user` with that user's own group only."""
    if user is None:
        return {}
    return {"user": user, "group": user, "extra_groups": []}


class ChildServer:
    """Base of the embedded servers; subclasses say how to prepare, run and probe theirs."""

    name = "server"
    stop_signal = signal.SIGTERM

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.auto_port = port == 0
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = False

    def argv(self) -> list[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        """Create or repair the data directory before a start."""

    @property
    def url(self) -> str:
        raise NotImplementedError

    def ping(self) -> bool:
        raise NotImplementedError

    def run_as(self) -> str | None:
        """System user to run the server as (None: the daemon's own)."""
        return None

    def cwd(self) -> Path | None:
        """Working directory of the child (None: the daemon's own)."""
        return None

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.name}.log"

    def open_log(self) -> BinaryIO:
        """The server's log, appended to, readable by the data dir's owner only."""
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # a log made by an older version was 0644
        return os.fdopen(fd, "ab")

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the child and block until it answers; raises EmbeddedStartError.

        A port we picked ourselves can be taken between picking and binding (another process got it
        first): then the child exits at once, and on a first start we try again on a fresh port. A
        restart keeps its port: the daemon's clients know the server by it.
        """
        for attempt in range(3):
            try:
                self._prepare()
                self._spawn()
                self._wait_ready(timeout)
                return self._ready()
            except EmbeddedStartError:
                self._retry_on_another_port(attempt)

    async def start_async(self) -> None:
        """start() for the daemon's event loop: preparing and waiting in worker threads, spawning in this one.

        The child's parent-death signal fires when the *thread* that spawned it exits, and anyio
        retires worker threads that sit idle: spawned from a worker, a server would be killed some
        time later, when another call into a thread retires that worker.
        """
        for attempt in range(3):
            try:
                await anyio.to_thread.run_sync(self._prepare)
                self._spawn()
                await anyio.to_thread.run_sync(self._wait_ready, START_TIMEOUT)
                return self._ready()
            except EmbeddedStartError:
                self._retry_on_another_port(attempt)

    def _retry_on_another_port(self, attempt: int) -> None:
        """Re-raise unless a port we picked ourselves may have been taken (see start())."""
        if not self.auto_port or attempt == 2 or self.proc is None:
            raise
        log.warning("embedded server exited at start; trying another port", server=self.name, port=self.port)
        self.port = free_port()

    def _prepare(self) -> None:
        private_dir(self.directory)
        self.prepare()

    def _spawn(self) -> None:
        with self.open_log() as out:
            self.proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.cwd(),
                umask=CHILD_UMASK, preexec_fn=_die_with_parent(self.stop_signal), start_new_session=True,
                **as_user(self.run_as()),
            )

    def _ready(self) -> None:
        self.auto_port = False
        log.info("embedded server ready", server=self.name, port=self.port, pid=self.proc.pid if self.proc else 0)

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EmbeddedStartError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            if self.ping() and self.proc.poll() is None:
                return
            time.sleep(0.05)
        self._terminate()
        raise EmbeddedStartError(f"{self.name} did not answer within {timeout:.0f}s; see {self.log_path}")

    def stop(self, timeout: float = 8.0) -> None:
        """Stop the child gracefully, then by force, and never restart it; safe to call twice."""
        self._stopping = True
        self._terminate(timeout)

    def _terminate(self, timeout: float = 8.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(self.stop_signal)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def alive(self) -> bool:
        """True while the child process runs."""
        return self.proc is not None and self.proc.poll() is None

    async def supervise(self, on_change: Callable[[str, bool], None]) -> None:
        """Watch the child forever; restart it with backoff when it dies."""
        delay = 0.1
        while not self._stopping:
            await anyio.sleep(0.05)
            if self.alive() or self._stopping:
                continue
            on_change(self.name, False)
            log.error("embedded server died; restarting", server=self.name, retry_in=delay)
            await anyio.sleep(delay)
            delay = await self._restart(delay)

    async def _restart(self, delay: float) -> float:
        try:
            await self.start_async()
        except (EmbeddedStartError, OSError) as exc:
            log.error("embedded server restart failed", server=self.name, error=str(exc))
            return min(delay * 2, 5.0)
        EMBEDDED_RESTARTS.labels(self.name).inc()
        log.info("embedded server restarted", server=self.name, port=self.port)
        return 0.1
