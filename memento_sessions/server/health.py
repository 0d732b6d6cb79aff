"""Readiness: each backend probed every quarter second; /readyz is 200 only while all answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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

    def set(self, name: str, up: bool) -> None:
        """Record a backend's state, logging each change."""
        new = "up" if up else "down"
        if self.status.get(name) != new:
            log.info("backend status", backend=name, status=new)
        self.status[name] = new
        BACKEND_UP.labels(name).set(1 if up else 0)

    @property
    def ready(self) -> bool:
        return all(state == "up" for state in self.status.values())


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
