"""The embedded servers' start-up: a port taken between picking and binding, a foreign server on it."""

from __future__ import annotations

import socket
from pathlib import Path

import redis

from memento_sessions.embedded.redis import EmbeddedRedis
from memento_sessions.endpoints import Endpoints


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
