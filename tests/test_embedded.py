"""The embedded servers: start-up (a port taken meanwhile, a foreign server on it), passwords, file modes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import anyio
import asyncpg
import pytest
import redis

from memento_sessions.embedded.process import as_user
from memento_sessions.embedded.redis import EmbeddedRedis, move_graphs
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import embedded_servers
from memento_sessions.settings import load_settings


def test_a_picked_port_taken_meanwhile_is_replaced_by_another(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = EmbeddedRedis(tmp_path / "redis")
        server.port = taken  # as if another process bound it after we picked it
        server.start()
        try:
            assert server.port != taken
            assert redis.Redis.from_url(server.tcp_url).ping()
        finally:
            server.stop()


def test_a_foreign_redis_on_our_port_is_not_taken_for_ours(tmp_path: Path, backend_urls: Endpoints) -> None:
    """The session's Redis already listens on that port: ours fails to bind, and we must notice."""
    foreign_port = int(redis.Redis.from_url(backend_urls.redis_url).info("server")["tcp_port"])
    server = EmbeddedRedis(tmp_path / "redis")
    server.port = foreign_port
    server.start()
    try:
        assert server.port != foreign_port, "ours moved to another port rather than trusting the foreign server"
        info = redis.Redis.from_url(server.tcp_url).info("server")
        assert info["process_id"] == server.proc.pid if server.proc else False
    finally:
        server.stop()


def test_clients_get_the_unix_socket_when_its_path_fits(tmp_path: Path) -> None:
    """The socket (lower latency) when its path fits sockaddr_un, the port when it does not; both serve."""
    short = EmbeddedRedis(tmp_path / "redis")
    deep = EmbeddedRedis(tmp_path / ("d" * 100) / "redis")
    for server in (short, deep):
        server.start()
    try:
        assert short.url == f"unix://:{short.password}@{tmp_path}/redis/redis.sock"
        assert redis.Redis.from_url(short.url).info("server")["process_id"] == (short.proc.pid if short.proc else 0)
        assert redis.Redis.from_url(short.tcp_url).ping()
        assert deep.socket_path is None and deep.url == deep.tcp_url
        assert redis.Redis.from_url(deep.url).info("server")["process_id"] == (deep.proc.pid if deep.proc else 0)
    finally:
        for server in (short, deep):
            server.stop()


def test_a_foreign_postgres_on_our_port_is_not_taken_for_ours(tmp_path: Path, backend_urls: Endpoints) -> None:
    from memento_sessions.embedded.postgres import EmbeddedPostgres

    foreign_port = int((backend_urls.postgres_dsn or "").rsplit(":", 1)[1].split("/")[0])
    server = EmbeddedPostgres(tmp_path / "postgres")
    server.port = foreign_port
    server.start()
    try:
        assert server.port != foreign_port
        lines = (server.pgdata / "postmaster.pid").read_text().splitlines()
        assert (lines[3].strip(), lines[7].strip()) == (str(server.port), "ready")
    finally:
        server.stop()


def owner_only(directory: Path) -> dict[str, str]:
    """Every path under `directory` that another user could read, write or enter, with its mode."""
    return {str(path.relative_to(directory)): oct(path.lstat().st_mode & 0o777)
            for path in directory.rglob("*") if path.lstat().st_mode & 0o077}


def test_the_embedded_redis_requires_its_password_and_keeps_its_files_owner_only(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    try:
        for url in (f"redis://127.0.0.1:{server.port}/0", f"unix://{server.socket_path}"):
            with pytest.raises(redis.AuthenticationError):
                redis.Redis.from_url(url).set("k", "v")
        assert redis.Redis.from_url(server.url).set("k", "v")
        password = (tmp_path / "redis" / "password").read_text()
        assert len(password) == 48 and password == server.password
        assert password.encode() not in Path(f"/proc/{server.proc.pid if server.proc else 0}/cmdline").read_bytes()
        time.sleep(1.1)  # appendfsync everysec: the AOF files exist
        assert list((tmp_path / "redis" / "appendonlydir").glob("*.aof"))
        assert owner_only(tmp_path / "redis") == {}
        assert (tmp_path / "redis").stat().st_mode & 0o777 == 0o700
    finally:
        server.stop()


def test_the_embedded_redis_is_ready_only_once_its_aof_is_loaded(tmp_path: Path) -> None:
    """Readiness waited for `loading:0`: right after start() every command works (no LOADING error)."""
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    try:
        pipe = redis.Redis.from_url(server.url).pipeline(transaction=False)
        for i in range(10_000):
            pipe.execute_command("GRAPH.QUERY", "g", f"CREATE (:N {{i: {i}}})")  # type: ignore[no-untyped-call]
        pipe.execute()
    finally:
        server.stop()
    again = EmbeddedRedis(tmp_path / "redis")
    again.start()
    try:
        client = redis.Redis.from_url(again.url)
        assert client.info("persistence")["loading"] == 0
        counted = client.execute_command("GRAPH.QUERY", "g", "MATCH (n:N) RETURN count(n)")  # type: ignore[no-untyped-call]
        assert counted[1] == [[10_000]]
    finally:
        again.stop()


def test_the_embedded_postgres_asks_for_a_password_and_keeps_its_files_owner_only(tmp_path: Path) -> None:
    from memento_sessions.embedded.postgres import EmbeddedPostgres

    server = EmbeddedPostgres(tmp_path / "postgres")
    server.start()
    try:
        with pytest.raises(asyncpg.InvalidPasswordError):
            anyio.run(fetch, f"postgresql://postgres@127.0.0.1:{server.port}/postgres", "SELECT 1")
        assert anyio.run(fetch, server.url, "SELECT 1") == 1
        assert "trust" not in (server.pgdata / "pg_hba.conf").read_text()
        assert (tmp_path / "postgres" / "password").stat().st_mode & 0o777 == 0o600
        assert owner_only(tmp_path / "postgres") == {}
    finally:
        server.stop()


def test_the_embedded_postgres_changes_nothing_outside_its_directory(tmp_path: Path) -> None:
    """As root it runs as `pgserver`, which cannot enter a 0700 home: it must get in without opening it."""
    from memento_sessions.embedded.postgres import EmbeddedPostgres

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    before = {path: path.stat().st_mode for path in (tmp_path, home)}
    server = EmbeddedPostgres(home / "project" / "postgres")
    server.start()
    try:
        assert anyio.run(fetch, server.url, "SELECT 1") == 1
    finally:
        server.stop()
    assert {path: path.stat().st_mode for path in (tmp_path, home)} == before
    assert home.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs Postgres as another user (`pgserver`)")
def test_as_root_postgres_installed_in_a_private_home_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository (and so pgserver's binaries) in root's 0700 home: `pgserver` cannot execute them there."""
    from memento_sessions.embedded import postgres

    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    site = home / "app" / ".venv" / "site-packages"  # the wheel's layout: the binaries' rpath leads to its libs
    private_install = site / "pgserver" / "pginstall"
    shutil.copytree(postgres._bin_dir().parent, private_install, symlinks=True)
    shutil.copytree(postgres._bin_dir().parent.parent.parent / "pgserver.libs", site / "pgserver.libs")
    monkeypatch.setattr(postgres, "_bin_dir", lambda: private_install / "bin")
    before = {path: path.stat().st_mode for path in (tmp_path, home, private_install)}
    server = postgres.EmbeddedPostgres(home / "app" / "data" / "postgres")
    server.start()
    try:
        assert anyio.run(fetch, server.url, "SELECT 1") == 1
        assert server.proc is not None
        running = Path(f"/proc/{server.proc.pid}/exe").resolve()
        assert not running.is_relative_to(home), running
        assert running.stat().st_uid == 0 and running.parent.stat().st_mode & 0o777 == 0o755
    finally:
        server.stop()
    assert {path: path.stat().st_mode for path in (tmp_path, home, private_install)} == before


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs Postgres as another user (`pgserver`)")
def test_as_root_an_install_that_cannot_be_shared_is_one_clear_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from memento_sessions.embedded import postgres
    from memento_sessions.errors import EmbeddedStartError

    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    private_bin = home / "site-packages" / "pgserver" / "pginstall" / "bin"
    private_bin.mkdir(parents=True)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(postgres, "_bin_dir", lambda: private_bin)
    monkeypatch.setattr(postgres, "SHARED_INSTALLS", tmp_path / "a-file" / "shared")  # cannot be made
    with pytest.raises(EmbeddedStartError, match="MEMENTO_POSTGRES_DSN") as raised:
        postgres.EmbeddedPostgres(home / "data" / "postgres")
    assert "'pgserver'" in str(raised.value) and str(private_bin.parent) in str(raised.value)


def test_a_cluster_made_with_trust_authentication_gets_a_password(tmp_path: Path) -> None:
    """A data dir from an older version (initdb --auth=trust) is locked down at its next start."""
    from memento_sessions.embedded.postgres import EmbeddedPostgres

    server = EmbeddedPostgres(tmp_path / "postgres")
    server.directory.mkdir(mode=0o700)
    server._own_pgdata(server.run_as())
    done = subprocess.run([str(server.bin / "initdb"), "-D", server.data_arg, "--auth=trust", "-U", "postgres",
                           "--no-sync"], cwd=server.cwd(), capture_output=True, check=False, **as_user(server.run_as()))
    assert done.returncode == 0, done.stdout
    server.start()
    try:
        with pytest.raises(asyncpg.InvalidPasswordError):
            anyio.run(fetch, f"postgresql://postgres@127.0.0.1:{server.port}/postgres", "SELECT 1")
        assert anyio.run(fetch, server.url, "SELECT 1") == 1
    finally:
        server.stop()


async def fetch(dsn: str, query: str) -> object:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()


@pytest.mark.anyio
async def test_a_server_started_by_the_daemon_outlives_the_worker_threads(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Its parent-death signal follows the thread that spawned it; anyio retires idle worker threads."""
    from anyio._backends._asyncio import WorkerThread

    server = EmbeddedRedis(tmp_path / "redis")
    await server.start_async()
    try:
        monkeypatch.setattr(WorkerThread, "MAX_IDLE_TIME", 0)  # as if the daemon had been idle for 10 s
        await retire_idle_workers()
        await anyio.sleep(0.5)
        assert server.alive(), "the server died with the worker thread that started it"
    finally:
        server.stop()


async def retire_idle_workers() -> None:
    """End every worker thread idle now: the first of three calls reuses the idle one, which is done
    first, and the call after them keeps only the last done (anyio prunes the others)."""
    async with anyio.create_task_group() as tg:
        for delay in (0.0, 0.1, 0.2):
            tg.start_soon(anyio.to_thread.run_sync, time.sleep, delay)
            await anyio.sleep(0.01)
    await anyio.to_thread.run_sync(time.sleep, 0)


def graph_count(url: str, graph: str) -> int:
    with redis.Redis.from_url(url) as client:
        reply = client.execute_command("GRAPH.QUERY", graph, "MATCH (n:N) RETURN count(n)")
    return int(reply[1][0][0])


def test_graphs_an_older_version_kept_with_the_sessions_move_to_the_graphs_server(tmp_path: Path) -> None:
    """A data dir from before the split: its sessions' Redis starts with FalkorDB once, its graphs move, and from
    then on it starts without FalkorDB, its other keys kept."""
    old = EmbeddedRedis(tmp_path / "redis")  # the single server of an older version, FalkorDB loaded
    old.start()
    try:
        with redis.Redis.from_url(old.url) as client:
            client.set("memento:kept", "yes")
            client.execute_command("GRAPH.QUERY", "memento_a", "UNWIND range(1, 500) AS i CREATE (:N {i: i})")
    finally:
        old.stop()
    sessions = EmbeddedRedis(tmp_path / "redis", falkordb=False)
    graphs = EmbeddedRedis(tmp_path / "falkordb", name="falkordb")
    assert sessions.holds_old_graphs and "--loadmodule" in sessions.argv()
    for server in (sessions, graphs):
        server.start()
    try:
        assert move_graphs(sessions, graphs) == 1
        assert graph_count(graphs.url, "memento_a") == 500
    finally:
        sessions.stop()
    again = EmbeddedRedis(tmp_path / "redis", falkordb=False)
    assert not again.holds_old_graphs and "--loadmodule" not in again.argv()
    again.start()  # its rewritten AOF loads without the module
    try:
        with redis.Redis.from_url(again.url) as client:
            assert client.get("memento:kept") == b"yes" and client.exists("memento_a") == 0
        assert move_graphs(again, graphs) == 0
    finally:
        again.stop()
        graphs.stop()


def test_a_new_sessions_redis_never_loads_falkordb(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", falkordb=False, maxmemory=64 * 1024 * 1024)
    server.start()
    try:
        assert "--loadmodule" not in server.argv()
        with redis.Redis.from_url(server.url, decode_responses=True) as client:
            assert client.config_get("maxmemory") == {"maxmemory": str(64 * 1024 * 1024)}
            with pytest.raises(redis.ResponseError, match="unknown command"):
                client.execute_command("GRAPH.LIST")
    finally:
        server.stop()


def test_the_embedded_aofs_are_rewritten_past_the_setting_not_redis_own_64mb(tmp_path: Path) -> None:
    """The end of each AOF rewrite stalls Redis while it syncs the manifest: the setting makes them rare."""
    settings = load_settings(data_dir=tmp_path, redis_aof_rewrite_size="2MiB", postgres_dsn="postgresql://x@h/d")
    servers = embedded_servers(settings)
    assert [server.name for server in servers] == ["redis", "falkordb"]
    assert {server.aof_rewrite_size for server in servers if isinstance(server, EmbeddedRedis)} == {2 * 1024**2}
    assert load_settings().redis_aof_rewrite_size == 1024**3
    small = EmbeddedRedis(tmp_path / "small", falkordb=False, aof_rewrite_size=2 * 1024**2)
    default = EmbeddedRedis(tmp_path / "default", falkordb=False)
    rewrites = []
    for server in (small, default):
        server.start()
        try:
            with redis.Redis.from_url(server.url, decode_responses=True) as client:
                for n in range(16):  # 4 MiB: past 2 MiB, and past twice the empty base
                    client.set(f"k{n}", "x" * 256 * 1024)
                time.sleep(1.0)  # a rewrite started takes a few ms here; give it its time
                info = client.info("persistence")
                rewrites.append(int(info["aof_rewrites"]) + int(info["aof_rewrite_in_progress"]))
        finally:
            server.stop()
    assert rewrites[0] >= 1 and rewrites[1] == 0, rewrites
