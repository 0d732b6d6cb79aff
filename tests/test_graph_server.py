"""The graphs' own redis-server in the embedded default, and the embedded Redis's maxmemory.

A graph query holds its redis-server's one thread while it runs: the daemon runs the sessions' Redis
without FalkorDB and a second redis-server with FalkorDB for the graphs, so a long graph write never
delays an emit. Past its maxmemory, a Redis refuses writes (noeviction) and the daemon says so.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import anyio
import pytest
import redis
import redis.asyncio as aioredis

from memento_sessions.embedded.redis import EmbeddedRedis
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import running
from memento_sessions.settings import Settings, load_settings
from tests.helpers import SECRET, make_settings, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio
GRAPH_WRITE = "UNWIND range(1, $n) AS i CREATE (:Load {i: i})"


def embedded_settings(data_dir: Path) -> Settings:
    """The embedded default: no Redis, FalkorDB or Postgres URL (Postgres off, to start faster)."""
    return load_settings(redis_url=None, falkordb_url=None, postgres_dsn="off", data_dir=data_dir, port=0,
                         auth_secret=SECRET, log_format="console", log_level="warning")


def runtime(data_dir: Path) -> dict[str, str]:
    return dict(json.loads((data_dir / "runtime.json").read_text()))


def server_pid(url: str) -> int:
    with redis.Redis.from_url(url, decode_responses=True) as client:
        return int(client.info("server")["process_id"])


@pytest.mark.topology_independent
async def test_the_embedded_default_runs_the_graphs_in_a_redis_server_of_their_own(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with running(embedded_settings(data_dir)):
        urls = runtime(data_dir)
        assert server_pid(urls["redis_url"]) != server_pid(urls["falkordb_url"])
        with redis.Redis.from_url(urls["redis_url"]) as sessions, pytest.raises(redis.ResponseError, match="unknown"):
            sessions.execute_command("GRAPH.LIST")  # no FalkorDB in the sessions'
        env = {key: value for key, value in os.environ.items() if not key.startswith("MEMENTO_")}
        done = await anyio.run_process([sys.executable, "-m", "memento_sessions.cli", "check"], check=False,
                                       env={**env, "MEMENTO_DATA_DIR": str(data_dir), "MEMENTO_POSTGRES_DSN": "off"})
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().splitlines() == ["redis: up", "falkordb: up"]


@pytest.mark.topology_independent
async def test_a_long_graph_write_does_not_delay_a_session_emit(tmp_path: Path, namespace: str) -> None:
    data_dir = tmp_path / "data"
    graph_ms: list[float] = []
    emit_ms: list[float] = []
    async with running(embedded_settings(data_dir)) as daemon, rpc(daemon.port, token("a", namespace)) as peer:
        urls = runtime(data_dir)
        graphs = aioredis.Redis.from_url(urls.get("falkordb_url") or urls["redis_url"])  # one server before the split
        sid = (await peer.call("session.create", {}))["sessionId"]
        done = anyio.Event()

        async def write_graph() -> None:
            try:
                started = time.perf_counter()
                await graphs.execute_command(  # type: ignore[no-untyped-call]
                    "GRAPH.QUERY", f"load_{namespace}", f"CYPHER n=1000000 {GRAPH_WRITE}")
                graph_ms.append((time.perf_counter() - started) * 1000)
            finally:
                done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(write_graph)
            await anyio.sleep(0.05)
            while not done.is_set():
                started = time.perf_counter()
                await peer.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}})
                emit_ms.append((time.perf_counter() - started) * 1000)
                await anyio.sleep(0.01)
        await graphs.delete(f"load_{namespace}")
        await graphs.aclose()
    p50, worst = statistics.median(emit_ms), max(emit_ms)
    print(f"\ngraph write {graph_ms[0]:.0f} ms; {len(emit_ms)} emits meanwhile: p50 {p50:.1f} ms, "
          f"max {worst:.1f} ms")
    assert graph_ms[0] > 300  # the write held its server long enough to matter
    # Generous: an emit sharing the graph's server waits for most of the write (200 of 425 ms, measured).
    assert p50 < 50 and worst < min(250, graph_ms[0] / 3)


async def test_a_redis_at_its_maxmemory_refuses_writes_with_a_clear_error(backend_urls: Endpoints, tmp_path: Path,
                                                                         namespace: str,
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    small = EmbeddedRedis(tmp_path / "small", falkordb=False, maxmemory=4 * 1024 * 1024)
    small.start()
    try:
        with redis.Redis.from_url(small.url, decode_responses=True) as client:
            assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        settings = make_settings(backend_urls, tmp_path / "data", redis_url=small.url, checkpoint_every=100_000)
        events = [{"type": "modified", "data": {"blob": "x" * 15_000}} for _ in range(20)]
        async with running(settings) as daemon, rpc(daemon.port, token("a", namespace)) as peer:
            sid = (await peer.call("session.create", {}))["sessionId"]
            stored, reply = 0, await peer.request("event.emitBatch", {"sessionId": sid, "events": events})
            while "result" in reply and stored < 2000:
                stored += len(events)
                reply = await peer.request("event.emitBatch", {"sessionId": sid, "events": events})
            session = await peer.call("session.get", {"sessionId": sid})
    finally:
        small.stop()
    assert reply["error"]["code"] == -32050
    assert reply["error"]["data"] == {"backend": "redis", "reason": "outOfMemory"}
    assert reply["error"]["message"] == "backend out of memory: Redis refuses writes"
    assert 20 < stored < 2000 and session["session"]["seq"] == stored  # nothing evicted, nothing half-written
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.topology_independent
async def test_a_daemon_on_an_older_data_dir_moves_its_graphs_to_their_own_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    old = EmbeddedRedis(data_dir / "redis")  # an older version's one server, sessions and graphs
    old.start()
    try:
        with redis.Redis.from_url(old.url) as client:
            client.execute_command("GRAPH.QUERY", "memento_ns", "UNWIND range(1, 50) AS i CREATE (:N {i: i})")
    finally:
        old.stop()
    async with running(embedded_settings(data_dir)):
        urls = runtime(data_dir)
        with redis.Redis.from_url(urls["falkordb_url"]) as graphs, redis.Redis.from_url(urls["redis_url"]) as sessions:
            counted = graphs.execute_command("GRAPH.QUERY", "memento_ns", "MATCH (n:N) RETURN count(n)")
            assert counted[1] == [[50]] and sessions.exists("memento_ns") == 0
    assert (data_dir / "redis" / "graph-free").exists()  # its next start is without FalkorDB
