"""The daemon's services, built once from the backends and shared by every transport."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
from starlette.types import ASGIApp

from memento_sessions import keys
from memento_sessions.api.build import registry as build_registry
from memento_sessions.api.spec import Parts
from memento_sessions.backends import Backends
from memento_sessions.bridge import SessionBridge
from memento_sessions.bridge.methods import BridgeMethods
from memento_sessions.checkpoints.checkpointer import Checkpointer
from memento_sessions.checkpoints.methods import CheckpointMethods
from memento_sessions.checkpoints.retention import Lease, retention_job, run_while_leader
from memento_sessions.checkpoints.snapshots import Snapshots
from memento_sessions.checkpoints.triggers import Triggers
from memento_sessions.coordination.methods import CoordinationMethods
from memento_sessions.coordination.service import Coordination
from memento_sessions.embedded.datadir import auth_secret
from memento_sessions.history.methods import HistoryMethods
from memento_sessions.history.views import auto_compaction
from memento_sessions.kg.graph import Graphs
from memento_sessions.kg.methods import GraphMethods
from memento_sessions.lifecycle.methods import LifecycleService
from memento_sessions.mcp.http import serve_mcp
from memento_sessions.redisio.cluster import open_pipe
from memento_sessions.redisio.fanout import Fanout
from memento_sessions.rpc import Registry
from memento_sessions.sessions.conversation import ConversationMethods
from memento_sessions.sessions.janitor import janitor
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.methods import SessionMethods
from memento_sessions.settings import Settings
from memento_sessions.usage.methods import UsageMethods
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
    """Build the services, start their background tasks, and the registry of the declared methods over them."""
    pipe = open_pipe(redis_url, backends.redis, settings.redis_spin_us)
    triggers = Triggers(settings.checkpoint_every)  # the checkpointer's end of the emits: passed to the manager
    manager = SessionManager(backends.redis, settings, pipe, on_emitted=(triggers.on_emitted,),
                             on_full=auto_compaction(backends.postgres.enabled))
    await manager.start()
    fanout = Fanout(redis_url, keys.daemon_channel(uuid.uuid4().hex))
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(fanout.run)
            tg.start_soon(janitor, backends.redis)
            graphs, snapshots = Graphs(backends), Snapshots(backends.postgres)  # the daemon's one of each
            checkpointer = Checkpointer(settings, backends, manager, graphs, snapshots, triggers)
            await tg.start(checkpointer.run)
            await tg.start(run_while_leader, Lease(backends.redis), retention_job(graphs, snapshots, settings))
            lifecycle = LifecycleService(manager, backends)
            tg.start_soon(lifecycle.run)
            usage = UsageStore(backends.redis, settings)
            bridge = SessionBridge(manager, backends, settings.bridge_cache_events, settings.bridge_cache_bytes,
                                   graphs=graphs, snapshots=snapshots)
            coordination = Coordination(manager, fanout, graphs, settings, uuid.uuid4().hex[:12])
            await tg.start(coordination.run)
            registry = build_registry(Parts(
                sessions=SessionMethods(manager), lifecycle=lifecycle, history=HistoryMethods(lifecycle.history),
                conversation=ConversationMethods(manager),
                subscriptions=Subscriptions(manager, fanout), checkpoints=CheckpointMethods(checkpointer),
                graph=GraphMethods(graphs), bridge=BridgeMethods(bridge),
                coordination=CoordinationMethods(coordination), coord=coordination, usage=UsageMethods(usage)))
            async with serve_mcp(settings, registry) as mcp_app:
                otlp = OtlpReceiver(usage, settings, settings.auth_secret or auth_secret(settings.data_dir))
                yield Services(settings, backends, registry, manager, fanout, checkpointer, mcp_app, otlp)
            tg.cancel_scope.cancel()
    finally:
        await fanout.aclose()
        if pipe is not None:
            pipe.close()
