"""Where the backends are: configured URLs, or the embedded servers the daemon runs.

A running daemon writes `<data dir>/runtime.json` so that `check`, `prune`, `kg load` and `mcp`
reach the same embedded servers without being told their ports.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from memento_sessions.errors import ConfigError
from memento_sessions.settings import Settings


@dataclass(frozen=True)
class Endpoints:
    """The URLs the services connect to; `falkordb_url` None: the graphs live in the Redis of `redis_url`."""

    redis_url: str
    postgres_dsn: str | None
    falkordb_url: str | None = None


def runtime_file(settings: Settings) -> Path:
    return settings.data_dir / "runtime.json"


def write_runtime(settings: Settings, endpoints: Endpoints, port: int) -> None:
    """Record the embedded servers' URLs and the daemon's port for the other commands.

    The URLs carry the servers' passwords: the file is for the data dir's owner only (0600).
    """
    data = {**asdict(endpoints), "port": port, "pid": os.getpid()}
    path = runtime_file(settings)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(data))
    tmp.replace(path)


def remove_runtime(settings: Settings) -> None:
    runtime_file(settings).unlink(missing_ok=True)


def resolve(settings: Settings) -> Endpoints:
    """Configured URLs, else those of the running daemon's embedded servers."""
    runtime: dict[str, str | None] = {}
    needs_runtime = settings.redis_url is None or settings.postgres_dsn is None
    if needs_runtime:
        try:
            runtime = json.loads(runtime_file(settings).read_text())
        except (OSError, ValueError):
            raise ConfigError(
                f"no MEMENTO_REDIS_URL/MEMENTO_POSTGRES_DSN set and no daemon running on {settings.data_dir} "
                "(start `memento-sessions serve` or set the URLs)"
            ) from None
    redis_url = settings.redis_url or runtime.get("redis_url")
    assert redis_url is not None
    # The embedded graphs' server goes with the embedded Redis only, never with a Redis given by URL.
    falkordb_url = settings.falkordb_url or (runtime.get("falkordb_url") if settings.redis_url is None else None)
    return Endpoints(redis_url, postgres_dsn(settings, runtime.get("postgres_dsn")), falkordb_url)


def postgres_dsn(settings: Settings, embedded: str | None) -> str | None:
    """The DSN to use, None when Postgres is off."""
    if settings.postgres_dsn == "off":
        return None
    return settings.postgres_dsn or embedded
