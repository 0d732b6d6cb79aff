"""The daemon's services, built once from the backends and shared by every transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.types import ASGIApp

from memento_sessions.backends import Backends
from memento_sessions.rpc import Registry
from memento_sessions.sessions import methods as session_methods
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.settings import Settings


@dataclass
class Services:
    """Everything a request may need; the RPC registry holds the methods over them."""

    settings: Settings
    backends: Backends
    registry: Registry
    manager: SessionManager
    mcp_app: ASGIApp | None = None

    async def drain(self) -> None:
        """Finish in-flight background work before shutdown."""


@asynccontextmanager
async def open_services(settings: Settings, backends: Backends) -> AsyncIterator[Services]:
    """Build the services and register their methods."""
    registry = Registry()
    manager = SessionManager(backends.redis, settings)
    await manager.start()
    session_methods.register(registry, manager)
    yield Services(settings, backends, registry, manager)
