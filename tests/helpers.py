"""What tests import besides fixtures: the tests' secret and tokens, settings on the session's servers.

conftest.py holds the fixtures and starts the servers; it records here where the graphs live (FALKORDB, SINGLE),
which make_settings reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from memento_sessions.auth import issue_token
from memento_sessions.backends import Backends, is_cluster_client
from memento_sessions.endpoints import Endpoints
from memento_sessions.settings import Settings, load_settings

SECRET = "test-secret-that-is-long-enough-0123456789"
FALKORDB: list[str] = []  # the graphs' own server (the embedded default, and the cluster run's standalone FalkorDB)
SINGLE: list[str] = []  # the session's single Redis, in the single run


def token(agent: str, namespace: str = "default", scope: str = "sessions:read sessions:write",
          ttl: int = 3600) -> str:
    """A valid token signed with the tests' secret."""
    return issue_token(SECRET, agent, namespace, scope, ttl)


def falkordb_url(urls: Endpoints) -> str | None:
    """Where the graphs live: their own server when there is one (always beside a cluster), else None: in the
    Redis of the URL (one given with MEMENTO_TEST_REDIS_URL, which then serves test_cluster's graphs too)."""
    if urls.falkordb_url is not None:
        return urls.falkordb_url
    if not urls.redis_url.startswith("redis+cluster://"):
        return None
    return (FALKORDB or SINGLE)[0]


def make_settings(urls: Endpoints, data_dir: Path, **overrides: object) -> Settings:
    """Settings for an in-process daemon on the session's backends."""
    values: dict[str, object] = {
        "redis_url": urls.redis_url, "postgres_dsn": urls.postgres_dsn, "auth_secret": SECRET,
        "port": 0, "data_dir": data_dir, "log_format": "console", "log_level": "warning",
        "falkordb_url": falkordb_url(urls),
    }
    values.update(overrides)
    return load_settings(**values)


def use_containers(redis_url: str | None, postgres_dsn: str | None, docker: bool) -> bool:
    """Whether the session starts containers: only when Docker answers and no server of one's own was given
    (MEMENTO_TEST_REDIS_URL alone is honoured: that Redis, and an embedded Postgres beside it)."""
    return docker and not redis_url and not postgres_dsn


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    """A metric's current value from the Prometheus registry (0 before its first count)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def command_calls(backends: Backends, *commands: str) -> int:
    """Calls of the commands Redis has run (INFO commandstats: those of Functions count), over every primary."""
    def of(stats: Any) -> int:
        return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in commands)
    if not is_cluster_client(backends.redis):
        return of(await backends.redis.info("commandstats"))
    info: Any = await backends.redis.info("commandstats", target_nodes="primaries")
    return sum(of(node) for node in info.values())
