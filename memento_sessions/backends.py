"""Connections to Redis, FalkorDB and Postgres, opened once and shared by every service, and the Postgres
schema's migrations.

Migrations: Postgres schema versions: one table records them for every store, one advisory lock serialises changes.

Each store (checkpoints' failure snapshots, sessions' suspended sessions) keeps its own numbered migrations
(versions of its own range) and applies the missing ones at start; several daemons starting at once apply
each version once, since the lock is held for the whole transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import anyio
import asyncpg
import redis.asyncio as aioredis
from falkordb.asyncio import FalkorDB
from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AskError,
    ClusterError,
    MovedError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from memento_sessions import keys
from memento_sessions.errors import BackendUnavailable
from memento_sessions.logs import get_logger
from memento_sessions.settings import ClusterUrl, Settings, is_cluster

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Connection = PoolConnectionProxy[asyncpg.Record]

log = get_logger(__name__)

class ClusterUnreachable(RedisConnectionError):
    """No node of the Redis Cluster gave a usable topology (none answered, or those that did leave slots
    uncovered): redis-py raises its bare RedisClusterException for this, as for its own misuse."""


# Errors that mean "a backend did not answer": retried where safe, else reported as -32050. On a Redis
# Cluster: CLUSTERDOWN and MASTERDOWN (ClusterError), redirections past redis-py's limit (ClusterError, or
# the last MOVED/ASK itself, as its transactions raise it while a reshard or failover has two primaries
# sending a slot to each other), a slot no node serves (SlotNotCoveredError), no node reachable
# (ClusterUnreachable).
UNAVAILABLE: tuple[type[BaseException], ...] = (
    RedisConnectionError, RedisTimeoutError, ClusterError, MovedError, AskError, SlotNotCoveredError,
    TryAgainError, OSError,
    asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
)


# The same, once a driver error has been translated to ours.
UNANSWERED: tuple[type[BaseException], ...] = (*UNAVAILABLE, BackendUnavailable)


@contextmanager
def translated(backend: str) -> Iterator[None]:
    """Turn a driver error meaning `backend` did not answer into BackendUnavailable("<backend>: ...").

    FalkorDB is reached through the Redis driver, so its errors would read as Redis's without this.
    """
    try:
        yield
    except UNAVAILABLE as exc:
        raise BackendUnavailable(f"{backend}: {exc}") from exc
    except ResponseError as exc:
        if not out_of_memory(exc):
            raise
        raise BackendUnavailable(f"{backend}: {exc}") from exc


def out_of_memory(exc: BaseException) -> bool:
    """A Redis at its maxmemory refused a write (`OOM command not allowed ...`), as such or translated."""
    cause = exc.__cause__ if isinstance(exc, BackendUnavailable) and exc.__cause__ is not None else exc
    return isinstance(cause, ResponseError) and str(cause).startswith("OOM ")


def redis_client(url: str) -> aioredis.Redis:
    """A redis-py asyncio client that retries transient errors with jittered backoff.

    For a `redis+cluster://` URL, a RedisCluster: it routes every command by its key's slot and follows
    MOVED/ASK. It is typed as a Redis because the daemon sends it only commands a cluster serves the same
    way: single-slot reads and writes, pipelines and transactions within one session's hash tag, Functions
    whose keys share a slot, and FUNCTION LOAD (sent to every primary).
    """
    if is_cluster(url):
        return cast(aioredis.Redis, cluster_client(ClusterUrl.parse(url)))
    retry = Retry(ExponentialWithJitterBackoff(base=0.02, cap=1.0), retries=3)
    return aioredis.Redis.from_url(
        url, decode_responses=True, socket_timeout=5.0, socket_connect_timeout=2.0, retry=retry,
        retry_on_error=[RedisConnectionError, RedisTimeoutError], health_check_interval=30,
        max_connections=512,
    )


def cluster_client(url: ClusterUrl, decode_responses: bool = True) -> RedisCluster:
    """A redis-py RedisCluster on the URL's seed nodes, connected (and its topology read) on first use.
    The daemon's decodes replies; a caller wanting bytes (as `Redis.from_url` gives by default) says so."""
    retry = AsyncRetry(ExponentialWithJitterBackoff(base=0.02, cap=1.0), retries=3)
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in url.nodes], username=url.username,
        password=url.password, decode_responses=decode_responses, socket_timeout=5.0, socket_connect_timeout=2.0,
        retry=retry, max_connections=512,
    )
    client.response_callbacks = _KeysDropped(client.response_callbacks)
    client.nodes_manager.__class__ = _NodesManager  # built by RedisCluster itself, with its own arguments
    return client


class _NodesManager(NodesManager):
    """redis-py's topology reader, whose failure to read any topology is raised as the outage it is."""

    __slots__ = ()  # as NodesManager's: the same layout, so that the instance's class can be swapped

    async def initialize(self, additional_startup_nodes_info: list[tuple[str, int]] | None = None,
                         last_failed_node_name: str | None = None) -> None:
        try:
            await super().initialize(additional_startup_nodes_info, last_failed_node_name)
        except RedisClusterException as exc:  # raised here only when no node gave a usable topology
            raise ClusterUnreachable(f"Redis Cluster: {exc}") from exc


class _KeysDropped(dict[str, Callable[..., Any]]):
    """Response callbacks that ignore a `keys=` argument: redis-py 8.1's async cluster transactions pass it
    to every callback (its other paths drop it first), and HGETALL's, among others, takes none."""

    def __getitem__(self, name: str) -> Callable[..., Any]:
        callback = super().__getitem__(name)

        def call(response: Any, **kwargs: Any) -> Any:
            kwargs.pop("keys", None)
            return callback(response, **kwargs)

        return call


def is_cluster_client(client: object) -> bool:
    """Whether a client from redis_client() talks to a Redis Cluster."""
    return isinstance(client, RedisCluster)


async def _nothing_to_reset(conn: asyncpg.Connection) -> None:
    """The pool's reset of a released connection, in place of asyncpg's reset query (advisory unlock, CLOSE
    ALL, UNLISTEN, RESET ALL): one more round trip on every use of the pool, for session state this code never
    leaves (its advisory locks are transaction-scoped; it never LISTENs, SETs or keeps a cursor). asyncpg
    still rolls back a transaction left open."""


class Postgres:
    """An asyncpg pool opened on first use, so the daemon starts while Postgres is down."""

    def __init__(self, dsn: str | None) -> None:
        self.dsn = dsn
        self._pool: asyncpg.Pool | None = None
        self._opening = anyio.Lock()  # two first callers at once must not open two pools (one would leak)

    @property
    def enabled(self) -> bool:
        return self.dsn is not None

    async def pool(self) -> asyncpg.Pool:
        """The pool; raises BackendUnavailable when Postgres is off or does not answer."""
        if self.dsn is None:
            raise BackendUnavailable("postgres is off (MEMENTO_POSTGRES_DSN=off)")
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    self._pool = await self._open(self.dsn)
        return self._pool

    @staticmethod
    async def _open(dsn: str) -> asyncpg.Pool:
        try:
            return await asyncpg.create_pool(dsn, min_size=1, max_size=8, timeout=2.0, command_timeout=10.0,
                                             reset=_nothing_to_reset)
        except (OSError, asyncpg.PostgresError) as exc:
            raise BackendUnavailable(f"postgres: {exc}") from exc

    async def ping(self) -> None:
        """One round trip; raises on failure."""
        pool = await self.pool()
        await pool.fetchval("SELECT 1", timeout=1.0)

    async def close(self) -> None:
        """Close the pool; safe to call twice."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


@dataclass
class Backends:
    """The daemon's three backends."""

    redis: aioredis.Redis
    falkordb: FalkorDB
    postgres: Postgres
    graph_prefix: str

    def graph_name(self, namespace: str) -> str:
        """The KG graph of a namespace under this daemon's MEMENTO_KG_GRAPH (keys.graph_name)."""
        return keys.graph_name(self.graph_prefix, namespace)


def falkordb_client(url: str) -> FalkorDB:
    """A FalkorDB client on a lazily connected asyncio pool.

    FalkorDB's own constructor probes for Cluster over a blocking connection: it stalls the event loop
    and fails while the server is down, so a daemon could not start to report it. Cluster is not
    supported here, so the client gets its connection the way that constructor would give it one.
    """
    client: FalkorDB = FalkorDB.__new__(FalkorDB)
    connection = aioredis.Redis.from_url(url, decode_responses=True, socket_timeout=5.0, socket_connect_timeout=2.0)
    client.connection = connection
    client.flushdb = connection.flushdb
    client.execute_command = connection.execute_command
    return client


@asynccontextmanager
async def open_backends(settings: Settings, redis_url: str, postgres_dsn: str | None,
                        falkordb_url: str | None = None) -> AsyncIterator[Backends]:
    """Open the clients (lazily connected) and close them on exit.

    The graphs are on MEMENTO_FALKORDB_URL, else on `falkordb_url` (the embedded graphs' server), else in the
    Redis of `redis_url`."""
    falkor_url = settings.falkordb_url or falkordb_url or redis_url
    backends = Backends(
        redis=redis_client(redis_url),
        falkordb=falkordb_client(falkor_url),
        postgres=Postgres(postgres_dsn),
        graph_prefix=settings.kg_graph,
    )
    try:
        yield backends
    finally:
        await backends.postgres.close()
        await backends.redis.aclose()
        await backends.falkordb.connection.aclose()


# Postgres schema migrations.

Migration = tuple[int, tuple[str, ...]]

SCHEMA_LOCK = 0x6D656D656E746F01  # advisory lock key held while changing the schema or partitions
LOCK_SCHEMA = "SELECT pg_advisory_xact_lock($1)"
CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS memento_schema_migrations (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
APPLIED_VERSIONS = "SELECT version FROM memento_schema_migrations"
RECORD_VERSION = "INSERT INTO memento_schema_migrations (version) VALUES ($1) ON CONFLICT DO NOTHING"


async def apply_missing(conn: Connection, migrations: Sequence[Migration]) -> None:
    """Apply the versions not yet recorded, in order, under the schema lock (call inside a transaction)."""
    await conn.execute(LOCK_SCHEMA, SCHEMA_LOCK)
    await conn.execute(CREATE_MIGRATIONS_TABLE)
    applied = {row["version"] for row in await conn.fetch(APPLIED_VERSIONS)}
    for version, statements in migrations:
        if version not in applied:
            await apply(conn, version, statements)


async def apply(conn: Connection, version: int, statements: tuple[str, ...]) -> None:
    """Run one migration's statements and record its version."""
    for statement in statements:
        await conn.execute(statement)
    await conn.execute(RECORD_VERSION, version)
    log.info("postgres schema migrated", version=version)


async def migrate(postgres: Postgres, migrations: Sequence[Migration]) -> None:
    """Apply a store's missing migrations in one transaction on the daemon's Postgres."""
    pool = await postgres.pool()
    async with pool.acquire() as conn, conn.transaction():
        await apply_missing(conn, migrations)


class MigratedStore:
    """A store over the daemon's (lazily connected) Postgres whose schema is migrated on first use.

    Shared by the suspended sessions' table (lifecycle/postgres.py) and the failure snapshots'
    (checkpoints/snapshots.py): one place for "migrate once per process, safely while other daemons do
    the same".
    """

    def __init__(self, postgres: Postgres, migrations: tuple[Migration, ...]) -> None:
        self.postgres, self.migrations = postgres, migrations
        self._migrated = False

    async def migrate(self) -> None:
        """Create or upgrade the schema; safe while another daemon does the same."""
        if self._migrated:
            return
        await migrate(self.postgres, self.migrations)
        await self.migrated()
        self._migrated = True

    async def migrated(self) -> None:
        """What a store prepares once its schema is current (nothing here)."""
