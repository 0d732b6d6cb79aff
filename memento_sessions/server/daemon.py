"""`memento-sessions serve`: embedded servers, backends, services and the HTTP port in one task group."""

from __future__ import annotations

import gc
import signal
import socket
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import anyio
import uvicorn
from anyio.abc import TaskGroup, TaskStatus

from memento_sessions.embedded.datadir import DataDirLock, auth_secret
from memento_sessions.embedded.postgres import EmbeddedPostgres
from memento_sessions.embedded.process import ChildServer
from memento_sessions.embedded.redis import EmbeddedRedis, move_graphs
from memento_sessions.endpoints import Endpoints, postgres_dsn, remove_runtime, write_runtime
from memento_sessions.errors import MAX_FRAME, ConfigError
from memento_sessions.logs import get_logger, guard_library_logs
from memento_sessions.metrics import GC_PAUSE_SECONDS
from memento_sessions.server.health import Health, probe_forever
from memento_sessions.settings import Settings

if TYPE_CHECKING:  # imported for real by load_services(), while the embedded servers start
    from memento_sessions.server.services import Services
    from memento_sessions.ws.gateway import Gateway

log = get_logger(__name__)
SHUTDOWN_GRACE = 2.0
GC_THRESHOLDS = (10_000, 10, 10)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon's task group owns SIGTERM."""

    @contextmanager
    def capture_signals(self) -> Any:
        yield


def embedded_servers(settings: Settings) -> list[ChildServer]:
    """The servers this daemon must run itself: those whose URL was not given.

    The embedded Redis holds the sessions, without FalkorDB; the graphs get a redis-server with FalkorDB of
    their own (unless MEMENTO_FALKORDB_URL names one), so no graph query can stall a session's emit.
    """
    servers: list[ChildServer] = []
    data, maxmemory, rewrite = settings.data_dir.resolve(), settings.redis_maxmemory, settings.redis_aof_rewrite_size
    if settings.redis_url is None:
        servers.append(EmbeddedRedis(data / "redis", settings.embedded_redis_port, falkordb=False,
                                     maxmemory=maxmemory, aof_rewrite_size=rewrite))
        if settings.falkordb_url is None:
            servers.append(EmbeddedRedis(data / "falkordb", settings.embedded_falkordb_port, maxmemory=maxmemory,
                                         aof_rewrite_size=rewrite, name="falkordb"))
    if settings.postgres_dsn is None:
        servers.append(EmbeddedPostgres(settings.data_dir.resolve() / "postgres", settings.embedded_postgres_port))
    return servers


def endpoints_of(settings: Settings, servers: list[ChildServer]) -> Endpoints:
    urls = {server.name: server.url for server in servers}
    redis_url = settings.redis_url or urls["redis"]
    falkordb_url = settings.falkordb_url or urls.get("falkordb")
    return Endpoints(redis_url, postgres_dsn(settings, urls.get("postgres")), falkordb_url)


async def move_old_graphs(servers: list[ChildServer]) -> None:
    """Move the graphs an older version kept in the sessions' Redis to the graphs' own server (once)."""
    named = {server.name: server for server in servers if isinstance(server, EmbeddedRedis)}
    if "redis" in named and "falkordb" in named:
        moved = await anyio.to_thread.run_sync(move_graphs, named["redis"], named["falkordb"])
        if moved:
            log.warning("graphs moved from the sessions' Redis to the graphs' own server", graphs=moved)


async def start_all(servers: list[ChildServer]) -> None:
    """Start the embedded servers side by side (each blocks until it answers), and meanwhile load the services.

    Importing the services (the MCP SDK, the drivers) costs a CPU second or more: done while the
    servers start, in threads that mostly wait, it adds nothing to a restart's time to ready.
    """
    async with anyio.create_task_group() as tg:
        for server in servers:
            tg.start_soon(server.start_async)
        await anyio.to_thread.run_sync(load_services)


def load_services() -> None:
    """Import the modules that serve requests (heavy, see start_all)."""
    import memento_sessions.backends
    import memento_sessions.server.app
    import memento_sessions.server.services
    import memento_sessions.ws.gateway  # noqa: F401


def stop_all(servers: list[ChildServer]) -> None:
    for server in servers:
        server.stop()


def settle_gc() -> None:
    """Tune the cyclic collector once the daemon is built (docs/bridge.md, "Garbage collection").

    Everything built so far lives as long as the daemon: frozen, it stays out of full collections,
    which otherwise cost tens of ms (about 0.5 us per object) in the middle of a request. And the
    young generation is collected after 10,000 allocations rather than 700, so a request's
    short-lived objects (1,000 decoded events, a graph reply) die before a collection promotes them:
    promoted, they made a full collection every dozen first-call transitions.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    if _time_collections not in gc.callbacks:
        gc.callbacks.append(_time_collections)


_GC_STARTED = [0.0]
_GC_PAUSES = [GC_PAUSE_SECONDS.labels(str(generation)) for generation in range(3)]


def _time_collections(phase: str, info: dict[str, int]) -> None:
    """Each collection's pause into memento_gc_pause_seconds{generation}: a request stalled by one shows there."""
    if phase == "start":
        _GC_STARTED[0] = time.perf_counter()
    else:
        _GC_PAUSES[info["generation"]].observe(time.perf_counter() - _GC_STARTED[0])


def listen(host: str, port: int) -> socket.socket:
    """Bind the daemon's port ourselves so port 0 yields a known port.

    Every connection gets TCP_NODELAY: without it, a small write that follows another one still unacknowledged
    (a reply right behind a notification, an HTTP body behind its headers) waits for the peer's delayed ACK,
    40 ms on Linux. uvloop sets it on each connection it accepts; asyncio's own loop only on sockets made with
    proto IPPROTO_TCP (the accepted ones inherit it), and Linux and the BSDs copy the listener's option.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} (MEMENTO_HOST/MEMENTO_PORT): {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Daemon:
    """One daemon: run it with `await daemon.run()`, stop it with `daemon.stop()`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.servers = embedded_servers(settings)
        self.health = Health(["redis", "falkordb"] + (["postgres"] if settings.postgres_enabled else []))
        self.port = 0
        self.services: Services | None = None
        self.gateway: Gateway | None = None
        self._server: _Server | None = None
        self._sock: socket.socket | None = None
        self._stopping = anyio.Event()

    async def run(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until stop() or a signal; `task_status` gets the bound port."""
        guard_library_logs()  # also when embedded without configure_logging: no token in uvicorn's lines
        lock = DataDirLock(self.settings.data_dir) if self.servers else nullcontext()
        with lock, listen(self.settings.host, self.settings.port) as sock:
            self._sock = sock
            try:
                await start_all(self.servers)
                await move_old_graphs(self.servers)
                await self._serve(endpoints_of(self.settings, self.servers), task_status)
            finally:
                await anyio.to_thread.run_sync(stop_all, self.servers)
                remove_runtime(self.settings)
        log.info("daemon stopped")

    async def _serve(self, endpoints: Endpoints, task_status: TaskStatus[int]) -> None:
        from memento_sessions.backends import open_backends
        from memento_sessions.server.services import open_services
        from memento_sessions.ws.gateway import Gateway

        secret = self.settings.auth_secret or auth_secret(self.settings.data_dir)
        async with AsyncExitStack() as stack:
            backends = await stack.enter_async_context(open_backends(self.settings, endpoints.redis_url,
                                                                     endpoints.postgres_dsn, endpoints.falkordb_url))
            self.services = await stack.enter_async_context(open_services(self.settings, backends,
                                                                           endpoints.redis_url))
            tg = await stack.enter_async_context(anyio.create_task_group())
            self.gateway = Gateway(self.services.registry, secret, self.settings.ws_send_buffer,
                                   self.settings.ws_rate_limit, max_connections=self.settings.max_connections)
            for server in self.servers:
                tg.start_soon(server.supervise, self.health.set)
            tg.start_soon(probe_forever, backends, self.health)
            tg.start_soon(self._watch_signals)
            await self._run_http(tg, endpoints, task_status)
            tg.cancel_scope.cancel()

    async def _run_http(self, tg: TaskGroup, endpoints: Endpoints, task_status: TaskStatus[int]) -> None:
        from memento_sessions.server.app import build_app
        from memento_sessions.server.handshake import handshake_protocol
        from memento_sessions.server.keepalive import keep_alive
        from memento_sessions.server.websocket import WebSocketsSansIOProtocol

        assert self.gateway is not None and self.services is not None
        sock = self._sock
        assert sock is not None
        self.port = sock.getsockname()[1]
        app = build_app(self.gateway, self.health, self.services.mcp_app, self.services.otlp)
        config = uvicorn.Config(
            app, lifespan="off", log_config=None, ws=WebSocketsSansIOProtocol, ws_max_size=MAX_FRAME,
            ws_ping_interval=None, ws_ping_timeout=None,  # one task pings them all (server/keepalive.py)
            ws_per_message_deflate=False,
            timeout_graceful_shutdown=3, access_log=False,
            http=handshake_protocol(self.settings.handshake_timeout),
        )
        self._server = _Server(config)
        write_runtime(self.settings, endpoints if self.servers else None, self.port)
        tg.start_soon(self._started, task_status)
        tg.start_soon(keep_alive, self._server.server_state.connections, self.settings.ws_ping_interval)
        settle_gc()
        log.info("listening", host=self.settings.host, port=self.port)
        await self._server.serve(sockets=[sock])

    async def _started(self, task_status: TaskStatus[int]) -> None:
        while self._server is not None and not self._server.started:  # noqa: ASYNC110 - uvicorn has no event
            await anyio.sleep(0.01)
        task_status.started(self.port)

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("signal received; shutting down", signal=signal.Signals(signum).name)
                await self.stop()
                return

    async def stop(self) -> None:
        """Graceful stop: close WebSockets with 1001, flush checkpoints, stop the HTTP server."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self.gateway is not None:
            self.gateway.shutdown()
            with anyio.move_on_after(SHUTDOWN_GRACE):
                await self.gateway.closed_all.wait()
        if self.services is not None:
            await self.services.drain()
        if self._server is not None:
            self._server.should_exit = True


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Daemon]:
    """Run a daemon in the background of the caller's task group (tests, bench)."""
    daemon = Daemon(settings)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            yield daemon
        finally:
            await daemon.stop()
