"""The one settings object, read from MEMENTO_* variables (and .env) once at start.

Also the Redis Cluster URL, `redis+cluster://[user:password@]host:port[,host:port...]`, taken apart (`ClusterUrl`):
parsed when the settings are read, so a bad URL stops the daemon before it starts any server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import quote, unquote

from pydantic import ByteSize, Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from memento_sessions.errors import ConfigError

AOF_REWRITE_SIZE = 1024**3  # an embedded AOF's size past which Redis rewrites it (Redis's own default: 64 MB)

SCHEME = "redis+cluster://"
_NODE = re.compile(r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def is_cluster(url: str | None) -> bool:
    """Whether `url` names a Redis Cluster."""
    return url is not None and url.startswith(SCHEME)


@dataclass(frozen=True)
class ClusterUrl:
    """Seed nodes (any of the cluster's nodes: the topology is read from them) and the credentials."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> ClusterUrl:
        """Take a `redis+cluster://` URL apart; ValueError says what is wrong with it."""
        if not is_cluster(url):
            raise ValueError(f"a Redis Cluster URL starts with {SCHEME}")
        rest = url[len(SCHEME):]
        rest, _, path = rest.partition("/")
        if path not in ("", "0"):
            raise ValueError(f"a Redis Cluster has only database 0, not {path!r}")
        userinfo, _, hosts = rest.rpartition("@")
        username, _, password = userinfo.partition(":")
        nodes = tuple(_node(item) for item in hosts.split(","))
        return cls(nodes, unquote(username) or None, unquote(password) or None)

    def node_url(self, host: str, port: int) -> str:
        """A `redis://` URL of one node, with the credentials."""
        user, password = quote(self.username or "", safe=""), quote(self.password or "", safe="")
        auth = f"{user}:{password}@" if user or password else ""
        return f"redis://{auth}{host}:{port}/0"


def _node(item: str) -> tuple[str, int]:
    match = _NODE.fullmatch(item.strip())
    if match is None:
        raise ValueError(f"{item!r} is not host:port (the URL is redis+cluster://host:port[,host:port...])")
    port = int(match["port"])
    if not 0 < port < 65536:
        raise ValueError(f"{item!r}: the port must be 1-65535")
    return match["host"].strip("[]"), port


# Bounds that several settings share.
Port = Annotated[int, Field(ge=0, le=65535)]  # 0: any free port
Days = Annotated[int, Field(ge=1, le=3650)]  # a retention age: a day to ten years
Rate = Annotated[float, Field(ge=0.0, le=1_000_000.0)]  # requests a second (a connection's, an agent's); 0: off


class Settings(BaseSettings):
    """Configuration of one daemon; see the README's configuration table."""

    model_config = SettingsConfigDict(env_prefix="MEMENTO_", env_file=".env", frozen=True, extra="ignore")

    redis_url: str | None = None
    falkordb_url: str | None = Field(default=None, validate_default=True)
    kg_graph: str = Field(default="memento", pattern=r"^[A-Za-z0-9_]{1,64}$")
    postgres_dsn: str | None = None
    auth_secret: str | None = Field(default=None, min_length=32)
    session_ttl: int = Field(default=3600, ge=60, le=86400)
    checkpoint_every: int = Field(default=10, ge=1, le=100_000)
    checkpoint_grace_ttl: int = Field(default=300, ge=1, le=86400)
    anchor_cap: int = Field(default=5, ge=1, le=1000)
    anchor_chunk: int = Field(default=256, ge=1, le=100_000)  # entities anchored per graph query
    checkpoint_max_entities: int = Field(default=2048, ge=1, le=1_000_000)  # past it: counted, not anchored
    batch_ids_pace: int = Field(default=50_000, ge=0, le=100_000_000)  # entity ids/s a namespace's batches name
    anchor_max_age_days: Days = 7
    snapshot_max_age_days: Days = 30
    log_format: Literal["console", "json"] | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    host: str = "127.0.0.1"
    port: Port = 8765
    data_dir: Path = Path(".memento")
    embedded_redis_port: Port = 0
    embedded_falkordb_port: Port = 0
    redis_maxmemory: ByteSize = Field(default=ByteSize(2 * 1024**3), ge=0)  # each embedded Redis; 0: none
    redis_aof_rewrite_size: ByteSize = Field(default=ByteSize(AOF_REWRITE_SIZE), ge=1024 * 1024)  # embedded AOFs
    embedded_postgres_port: Port = 0
    token: str | None = None
    ws_send_buffer: int = Field(default=4 * 1024 * 1024, ge=64 * 1024, le=1024 * 1024 * 1024)
    ws_ping_interval: float = Field(default=20.0, ge=0.1, le=300.0)
    ws_rate_limit: Rate = 5000.0
    mcp_rate_limit: Rate = 1000.0
    mcp_allowed_hosts: str = ""  # comma-separated `name` or `name:port`, e.g. a reverse proxy's public name
    otlp_rate_limit: Rate = 100.0  # OTLP/HTTP requests a second per agent (usage/receiver.py)
    otlp_max_body: int = Field(default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    otlp_max_records: int = Field(default=10_000, ge=1, le=1_000_000)  # log records and metric points a request
    otlp_dedupe_window: int = Field(default=300, ge=0, le=3600)  # seconds a session remembers an OTLP request; 0: off
    otlp_dedupe_requests: int = Field(default=1000, ge=1, le=100_000)  # OTLP requests a session remembers at most
    redis_spin_us: int = Field(default=250, ge=0, le=10_000)
    replica_acks: int = Field(default=0, ge=0, le=16)
    replica_ack_timeout_ms: int = Field(default=1000, ge=1, le=4000)  # under the hot path's 5 s call watchdog
    bridge_cache_events: int = Field(default=50_000, ge=0, le=10_000_000)
    bridge_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0, le=16 * 1024 * 1024 * 1024)
    handoff_freshness_scan: int = Field(default=5000, ge=0, le=1_000_000)  # events a handoff reads for git records
    commits_max: int = Field(default=100_000, ge=1, le=100_000_000)  # commits noted per namespace (bridge.commit)
    session_max_events: int = Field(default=100_000, ge=10, le=100_000_000)
    usage_runs_per_session: int = Field(default=500, ge=1, le=100_000)
    usage_runs_per_agent: int = Field(default=2000, ge=1, le=1_000_000)
    usage_agents_per_session: int = Field(default=64, ge=1, le=10_000)  # agents whose share of a session is kept
    usage_ttl: int = Field(default=30 * 86400, ge=60, le=366 * 86400)  # seconds usage outlives its last write
    usage_metric_models: int = Field(default=20, ge=1, le=1000)  # model labels on the usage metrics, then "other"
    namespace_max_sessions: int = Field(default=10_000, ge=1, le=100_000_000)
    max_connections: int = Field(default=10_000, ge=1, le=1_000_000)
    ws_max_subscriptions: int = Field(default=1000, ge=1, le=1_000_000)
    handshake_timeout: float = Field(default=10.0, ge=0.1, le=300.0)
    mcp_max_sessions: int = Field(default=100, ge=1, le=100_000)
    presence_idle: float = Field(default=30.0, ge=0.5, le=3600.0)
    presence_visit: float = Field(default=300.0, ge=1.0, le=86400.0)  # present after a join/emit without staying
    lease_orphan_grace: float = Field(default=60.0, ge=1.0, le=3600.0)
    lease_max: int = Field(default=10_000, ge=1, le=10_000_000)
    lease_max_covered: int = Field(default=4096, ge=1, le=100_000)
    lease_pace: int = Field(default=4096, ge=0, le=100_000_000)  # covered entities/s a namespace's lease writes touch
    lease_call_entities: int = Field(default=256, ge=8, le=100_000)  # covered entities one lease Function call touches
    lease_pending_ttl: float = Field(default=10.0, ge=0.5, le=600.0)  # seconds a lease granted in parts may take
    lease_max_holds: int = Field(default=100, ge=1, le=100_000)
    lease_reply_max: int = Field(default=256, ge=1, le=100_000)
    lease_coverage_edges: int = Field(default=200_000, ge=0, le=100_000_000)
    intent_max_expanded: int = Field(default=512, ge=0, le=100_000)  # graph entities one intent's overlaps reach
    mailbox_ttl: int = Field(default=7 * 86400, ge=60, le=30 * 86400)
    mailbox_max: int = Field(default=1000, ge=1, le=1_000_000)
    mailboxes_max: int = Field(default=10_000, ge=1, le=10_000_000)  # agents with a mailbox, per namespace
    mailbox_unknown_agents: bool = False  # let a send reach an agent never seen in the namespace
    agents_known_max: int = Field(default=100_000, ge=1, le=10_000_000)  # agents a namespace remembers as seen
    hook_leases: Literal["off", "warn", "enforce"] = "warn"  # the hooks' lease policy on file edits
    hook_claim_ttl: int = Field(default=600, ge=0, le=3600)  # seconds of an edit's claim on its file (0: none)
    hook_notices_max: int = Field(default=20, ge=1, le=100)  # messages one hook answer or tool result surfaces
    hook_agents_max: int = Field(default=1000, ge=10, le=100_000)  # agents a namespace lists as at work now
    auto_compact: bool = True
    compact_keep: int = Field(default=1000, ge=0, le=100_000_000)
    snapshot_max_bytes: int = Field(default=32 * 1024 * 1024, ge=64 * 1024, le=16 * 1024 * 1024 * 1024)
    on_idle: Literal["expire", "suspend"] = "expire"
    archive_after_days: Days = 30
    suspend_chunk_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024, le=256 * 1024 * 1024)
    stage_chunk_bytes: int = Field(default=256 * 1024, ge=16 * 1024, le=64 * 1024 * 1024)  # per Redis call of a copy
    stage_pace_bytes: int = Field(default=16 * 1024 * 1024, ge=0, le=1 << 40)  # bytes/s a namespace's copies write
    heavy_max: int = Field(default=4, ge=1, le=1000)
    fork_max_depth: int = Field(default=32, ge=1, le=10_000)

    @field_validator("redis_url", "falkordb_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        schemes = ("redis://", "rediss://", "redis+cluster://", "unix://")
        if value is not None and not value.startswith(schemes):
            raise ValueError(f"must start with one of {', '.join(schemes)}")
        return value

    @field_validator("redis_url")
    @classmethod
    def _cluster_url(cls, value: str | None) -> str | None:
        if is_cluster(value) and value is not None:
            ClusterUrl.parse(value)  # a bad node list is refused here, before any server starts
        return value

    @field_validator("falkordb_url")
    @classmethod
    def _falkordb_standalone(cls, value: str | None, info: ValidationInfo) -> str | None:
        if is_cluster(value):
            raise ValueError("FalkorDB runs standalone: give a redis:// or unix:// URL")
        if value is None and is_cluster(info.data.get("redis_url")):
            raise ValueError("must be set (a standalone FalkorDB, redis:// or unix://) when MEMENTO_REDIS_URL "
                             "is redis+cluster://")
        return value

    @field_validator("mcp_allowed_hosts")
    @classmethod
    def _hosts(cls, value: str) -> str:
        for item in split_hosts(value):
            if not HOST.fullmatch(item):
                raise ValueError(f"{item!r} is not a host name or name:port (comma-separated, e.g. "
                                 "'memento.example.com,10.0.0.5:8443')")
        return value

    @property
    def extra_mcp_hosts(self) -> list[str]:
        """MEMENTO_MCP_ALLOWED_HOSTS as a list."""
        return split_hosts(self.mcp_allowed_hosts)

    @field_validator("postgres_dsn")
    @classmethod
    def _postgres_scheme(cls, value: str | None) -> str | None:
        if value is not None and value != "off" and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL or 'off'")
        return value

    @property
    def postgres_enabled(self) -> bool:
        """False when MEMENTO_POSTGRES_DSN is 'off'."""
        return self.postgres_dsn != "off"

    @property
    def embedded(self) -> bool:
        """True when this daemon starts its own Redis (and FalkorDB)."""
        return self.redis_url is None


HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
                  r"[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


def split_hosts(value: str) -> list[str]:
    """`a, b:1` -> ['a', 'b:1']."""
    return [item.strip() for item in value.split(",") if item.strip()]


def load_settings(**overrides: object) -> Settings:
    """Read the settings, turning a bad value into one ConfigError line naming the variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "MEMENTO_" + str(first["loc"][0]).upper() if first["loc"] else "MEMENTO_*"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"invalid {name}: {message}") from exc
