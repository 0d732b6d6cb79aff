"""Readiness: each backend probed every quarter second; /readyz is 200 only while all answer."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from memento_sessions.logs import get_logger
from memento_sessions.metrics import BACKEND_ERRORS, BACKEND_UP

if TYPE_CHECKING:  # the daemon imports this module before the backends' drivers (see daemon.py)
    from memento_sessions.backends import Backends

log = get_logger(__name__)
PROBE_INTERVAL = 0.25
PROBE_TIMEOUT = 0.75


class Health:
    """Per-backend status, updated by the probe loop and by the embedded supervisor."""

    def __init__(self, names: list[str]) -> None:
        self.status: dict[str, str] = dict.fromkeys(names, "starting")
        self.was_ready = False
        self._when_ready: list[Callable[[], None]] = []

    def when_ready(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, the first time every backend is up (at once if that time has passed)."""
        if self.was_ready:
            callback()
        else:
            self._when_ready.append(callback)

    def set(self, name: str, up: bool) -> None:
        """Record a backend's state, logging each change."""
        new = "up" if up else "down"
        if self.status.get(name) != new:
            log.info("backend status", backend=name, status=new)
        self.status[name] = new
        BACKEND_UP.labels(name).set(1 if up else 0)
        if not self.was_ready and self.ready:
            self.was_ready = True
            for callback in self._when_ready:
                callback()
            self._when_ready.clear()

    @property
    def ready(self) -> bool:
        return all(state == "up" for state in self.status.values())


def log_ready() -> None:
    """Log what the start cost: seconds since the process started, and the CPU seconds it used (every thread)."""
    log.info("ready", since_start=round(started_ago(), 2), cpu_seconds=round(time.process_time(), 2))


def started_ago() -> float:
    """Seconds since this process started, from /proc (the embedded servers need Linux already)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")


def probes(backends: Backends) -> dict[str, Callable[[], Awaitable[object]]]:
    """One cheap round trip per backend."""
    checks: dict[str, Callable[[], Awaitable[object]]] = {
        "redis": backends.redis.ping,
        "falkordb": lambda: backends.falkordb.connection.execute_command("GRAPH.LIST"),
    }
    if backends.postgres.enabled:
        checks["postgres"] = backends.postgres.ping
    return checks


async def probe_once(name: str, check: Callable[[], Awaitable[object]], health: Health) -> bool:
    """Run one probe with a timeout and record the result."""
    try:
        with anyio.fail_after(PROBE_TIMEOUT):
            await check()
    except Exception as exc:  # every failure means "down"; the reason is logged on the change
        if health.status.get(name) == "up":
            log.warning("backend probe failed", backend=name, error=repr(exc))
        BACKEND_ERRORS.labels(name).inc()
        health.set(name, False)
        return False
    health.set(name, True)
    return True


async def probe_forever(backends: Backends, health: Health) -> None:
    """Probe every backend, every PROBE_INTERVAL, concurrently."""
    checks = probes(backends)
    while True:
        async with anyio.create_task_group() as tg:
            for name, check in checks.items():
                tg.start_soon(probe_once, name, check, health)
        await anyio.sleep(PROBE_INTERVAL)
