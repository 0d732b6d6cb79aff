"""`memento-sessions check`: one probe per backend, exit 0 only when all answer."""

from __future__ import annotations

import sys

from memento_sessions.backends import open_backends
from memento_sessions.endpoints import resolve
from memento_sessions.server.health import Health, probe_once, probes
from memento_sessions.settings import Settings


async def check(settings: Settings) -> int:
    """Probe Redis, FalkorDB and Postgres; print one line each."""
    endpoints = resolve(settings)
    async with open_backends(settings, endpoints.redis_url, endpoints.postgres_dsn, endpoints.falkordb_url) as backends:
        checks = probes(backends)
        health = Health(list(checks))
        for name, probe in checks.items():
            await probe_once(name, probe, health)
    for name, status in health.status.items():
        print(f"{name}: {status}", file=sys.stdout)
    return 0 if health.ready else 1
