"""The daemon's services, built once from the backends and shared by every transport."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
from starlette.types import ASGIApp

from memento_sessions import keys
from memento_sessions.backends import Backends
from memento_sessions.bridge import SessionBridge
from memento_sessions.bridge import methods as bridge_methods
from memento_sessions.checkpoints import methods as checkpoint_methods
from memento_sessions.checkpoints.checkpointer import Checkpointer
from memento_sessions.checkpoints.retention import Lease, retention_job, run_while_leader
from memento_sessions.checkpoints.snapshots import Snapshots
from memento_sessions.coordination import methods as coordination_methods
from memento_sessions.coordination.service import Coordination
from memento_sessions.embedded.datadir import auth_secret
from memento_sessions.kg import methods as kg_methods
from memento_sessions.kg.graph import Graphs
from memento_sessions.mcp.http import serve_mcp
from memento_sessions.redisio.cluster import open_pipe
from memento_sessions.redisio.fanout import Fanout
from memento_sessions.rpc import Registry
from memento_sessions.sessions import conversation as conversation_methods
from memento_sessions.sessions import lifecycle_methods
from memento_sessions.sessions import methods as session_methods
from memento_sessions.sessions.janitor import janitor
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.settings import Settings
from memento_sessions.usage import methods as usage_methods
from memento_sessions.usage.receiver import OtlpReceiver
from memento_sessions.usage.store import UsageStore
from memento_sessions.ws.subscriptions import Subscriptions


@dataclass
class Services:
    """Everything a request may need; the RPC registry holds the methods over them."""

    settings: Settings
    backends: Backends
    registry: Registry
    manager: SessionManager
    fanout: Fanout
    checkpointer: Checkpointer
    mcp_app: ASGIApp | None = None
    otlp: OtlpReceiver | None = None  # POST /v1/logs and /v1/metrics

    async def drain(self) -> None:
        """Finish in-flight checkpoints (bounded) before shutdown."""
        await self.checkpointer.drain()


@asynccontextmanager
async def open_services(settings: Settings, backends: Backends, redis_url: str) -> AsyncIterator[Services]:
    """Build the services, start their background tasks and register their methods."""
    registry = Registry()
    pipe = open_pipe(redis_url, backends.redis, settings.redis_spin_us)
    manager = SessionManager(backends.redis, settings, pipe)
    await manager.start()
    fanout = Fanout(redis_url, keys.daemon_channel(uuid.uuid4().hex))
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(fanout.run)
            tg.start_soon(janitor, backends.redis)
            graphs, snapshots = Graphs(backends), Snapshots(backends.postgres)  # the daemon's one of each
            checkpointer = Checkpointer(settings, backends, manager, graphs, snapshots)
            await tg.start(checkpointer.run)
            await tg.start(run_while_leader, Lease(backends.redis), retention_job(graphs, snapshots, settings))
            session_methods.register(registry, manager)
            tg.start_soon(lifecycle_methods.register(registry, manager, backends).run)  # extends session.*
            conversation_methods.register(registry, manager)
            usage = UsageStore(backends.redis, settings)
            usage_methods.register(registry, usage)  # folds what event.emit and event.emitBatch store
            Subscriptions(manager, fanout).register(registry)
            checkpoint_methods.register(registry, checkpointer)
            kg_methods.register(registry, graphs)
            bridge = SessionBridge(manager, backends, settings.bridge_cache_events, settings.bridge_cache_bytes,
                                   graphs=graphs, snapshots=snapshots)
            bridge_methods.register(registry, bridge)
            coordination = Coordination(manager, fanout, graphs, settings, uuid.uuid4().hex[:12])
            await tg.start(coordination.run)
            coordination_methods.register(registry, coordination)  # after the others: it hooks them
            async with serve_mcp(settings, registry) as mcp_app:
                otlp = OtlpReceiver(usage, settings, settings.auth_secret or auth_secret(settings.data_dir))
                yield Services(settings, backends, registry, manager, fanout, checkpointer, mcp_app, otlp)
            tg.cancel_scope.cancel()
    finally:
        await fanout.aclose()
        if pipe is not None:
            pipe.close()
