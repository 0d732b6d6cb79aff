"""Real backends for the whole test session: the embedded redis-servers and Postgres, as the daemon runs them by
default: one Redis for the sessions, one with FalkorDB for the graphs (MEMENTO_FALKORDB_URL of the settings).

Set MEMENTO_TEST_REDIS_URL and/or MEMENTO_TEST_POSTGRES_DSN to use servers of your own instead (the other
one is started); a Redis given so holds the graphs too (it needs FalkorDB). When neither is set, a Docker
engine is reachable and testcontainers is installed, containers are started instead of the embedded servers
(MEMENTO_TEST_DOCKER=0 turns that off).
Helpers that tests import (SECRET, token, make_settings) live in tests/helpers.py.
MEMENTO_TEST_TOPOLOGY=cluster runs the suite on a local 3-primary Redis Cluster (tests/cluster.py) with
the embedded Redis as a standalone FalkorDB; the tests whose subject does not depend on the Redis
topology (TOPOLOGY_INDEPENDENT) are skipped in that run.
Each test is isolated by its own namespace, never by FLUSHALL.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from memento_sessions.backends import Backends, cluster_client, open_backends
from memento_sessions.embedded.postgres import EmbeddedPostgres
from memento_sessions.embedded.redis import EmbeddedRedis
from memento_sessions.endpoints import Endpoints
from memento_sessions.kg.graph import Graph, Graphs
from memento_sessions.logs import configure_logging
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.settings import ClusterUrl, Settings
from tests.cluster import LocalCluster
from tests.helpers import FALKORDB as _FALKORDB
from tests.helpers import SECRET as SECRET  # re-exported: tests import these from conftest too
from tests.helpers import SINGLE as _SINGLE
from tests.helpers import make_settings as make_settings
from tests.helpers import token as token
from tests.helpers import use_containers

TOPOLOGY = os.environ.get("MEMENTO_TEST_TOPOLOGY", "single")
# Modules whose subject is the same on any Redis topology (or needs none): run once, on single Redis.
# test_pipe and test_pubsub drive one raw connection to one node (test_cluster drives them on a cluster).
TOPOLOGY_INDEPENDENT = frozenset({
    "test_embedded", "test_deploy", "test_ingest_convert", "test_dashboard", "test_cli", "test_layout",
    "test_pipe", "test_pubsub", "test_daemon_process", "test_restart", "test_chaos",
})
_CLUSTER: list[LocalCluster] = []  # the session's cluster, in the cluster run
configure_logging("console", "warning")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "topology_independent: run on single Redis only (skipped in the cluster run)")
    if TOPOLOGY not in ("single", "cluster"):
        raise pytest.UsageError(f"MEMENTO_TEST_TOPOLOGY must be single or cluster, not {TOPOLOGY!r}")


def _cluster_aware_from_url() -> None:
    """In the cluster run, the tests' own admin clients (`redis.asyncio.Redis.from_url(urls.redis_url)`)
    get the daemon's kind of client for a redis+cluster:// URL: a real RedisCluster on the same nodes."""
    plain = aioredis.Redis.from_url.__func__  # type: ignore[attr-defined]

    def from_url(cls: type[aioredis.Redis], url: str, **kwargs: Any) -> aioredis.Redis:
        if not url.startswith("redis+cluster://"):
            return cast(aioredis.Redis, plain(cls, url, **kwargs))
        # bytes unless asked otherwise, as from_url gives them on a single Redis
        client: Any = cluster_client(ClusterUrl.parse(url), decode_responses=kwargs.get("decode_responses", False))
        # CLIENT KILL reaches every node (the tests cut the daemon's connections, wherever they are).
        client.command_flags["CLIENT KILL"] = client.ALL_NODES
        client.result_callbacks["CLIENT KILL"] = lambda command, replies, **kw: sum(replies.values())
        return cast(aioredis.Redis, client)

    aioredis.Redis.from_url = classmethod(from_url)  # type: ignore[assignment,method-assign,arg-type]


if TOPOLOGY == "cluster":
    _cluster_aware_from_url()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The cluster run skips the topology-independent tests; the single run skips test_cluster when told
    to (scripts/test runs it in the cluster run only)."""
    for item in items:
        found = getattr(item, "module", None)
        module = found.__name__.rsplit(".", 1)[-1] if found else ""
        independent = module in TOPOLOGY_INDEPENDENT or item.get_closest_marker("topology_independent")
        if TOPOLOGY == "cluster" and independent:
            item.add_marker(pytest.mark.skip(reason="topology-independent: runs in the single-Redis run"))
        elif module == "test_cluster" and os.environ.get("MEMENTO_TEST_TOPOLOGY") == "single":
            item.add_marker(pytest.mark.skip(reason="cluster-only: runs in the cluster run"))


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def backend_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """Redis, FalkorDB and Postgres for every test of the session."""
    redis_url = os.environ.get("MEMENTO_TEST_REDIS_URL")
    postgres_dsn = os.environ.get("MEMENTO_TEST_POSTGRES_DSN")
    if use_containers(redis_url, postgres_dsn, docker_reachable()):
        yield from _containers()
        return
    base = tmp_path_factory.mktemp("backends")
    started: list[EmbeddedRedis | EmbeddedPostgres | LocalCluster] = []
    if TOPOLOGY == "cluster" and not redis_url:
        falkordb = EmbeddedRedis(base / "falkordb")
        falkordb.start()
        cluster = LocalCluster(base / "cluster")
        started += [falkordb, cluster]
        cluster.start()
        _CLUSTER.append(cluster)
        _FALKORDB.append(falkordb.url)
        os.environ["MEMENTO_FALKORDB_URL"] = falkordb.url  # for the daemon processes tests start with os.environ
        redis_url = cluster.url
    graphs_url = _FALKORDB[0] if _FALKORDB else None
    if not redis_url:  # as the daemon runs them by default: the sessions' Redis, and the graphs' of their own
        graphs, redis = EmbeddedRedis(base / "falkordb", name="falkordb"), EmbeddedRedis(base / "redis", falkordb=False)
        for own in (graphs, redis):
            own.start()
            started.append(own)
        _FALKORDB.append(graphs.url)
        redis_url, graphs_url = redis.url, graphs.url
    if not redis_url.startswith("redis+cluster://"):
        _SINGLE[:] = [redis_url]
    if not postgres_dsn:
        postgres = EmbeddedPostgres(base / "postgres")
        postgres.start()
        started.append(postgres)
        postgres_dsn = postgres.url
    try:
        yield Endpoints(redis_url, postgres_dsn, graphs_url)
    finally:
        for server in started:
            server.stop()
        _CLUSTER.clear()


@pytest.fixture(scope="session")
def cluster(backend_urls: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's Redis Cluster in the cluster run; else one started for the tests that ask for it."""
    if _CLUSTER:
        yield _CLUSTER[0]
        return
    own = LocalCluster(tmp_path_factory.mktemp("cluster"))
    own.start()
    try:
        yield own
    finally:
        own.stop()


def docker_reachable() -> bool:
    """A Docker engine answers on its socket and testcontainers is importable."""
    if os.environ.get("MEMENTO_TEST_DOCKER") == "0":
        return False
    try:
        import testcontainers  # noqa: F401
    except ImportError:
        return False
    path = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(0.5)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def _containers() -> Iterator[Endpoints]:  # pragma: no cover - needs a Docker engine
    from testcontainers.core.container import DockerContainer
    from testcontainers.postgres import PostgresContainer

    with DockerContainer("falkordb/falkordb:latest").with_exposed_ports(6379) as falkor, \
            PostgresContainer("postgres:16") as pg:
        host, port = falkor.get_container_host_ip(), falkor.get_exposed_port(6379)
        yield Endpoints(f"redis://{host}:{port}/0", pg.get_connection_url(driver=None))


@pytest.fixture
def namespace() -> str:
    """A namespace of this test's own."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def settings(backend_urls: Endpoints, tmp_path: Path) -> Settings:
    return make_settings(backend_urls, tmp_path)


@pytest.fixture
async def daemon(settings: Settings) -> AsyncIterator[Daemon]:
    """A daemon serving on a free port for the length of one test."""
    async with running(settings) as d:
        yield d


@pytest.fixture
async def backends(settings: Settings, backend_urls: Endpoints) -> AsyncIterator[Backends]:
    """The daemon's backend clients, opened on the session's servers."""
    async with open_backends(settings, backend_urls.redis_url, backend_urls.postgres_dsn) as opened:
        yield opened


@pytest.fixture
async def graph(backends: Backends, namespace: str) -> AsyncIterator[Graph]:
    """The test namespace's own graph, deleted afterwards."""
    graph = await Graphs(backends).get(namespace)
    yield graph
    await graph.delete()
