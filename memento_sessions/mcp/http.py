"""`/mcp`: the MCP tools over streamable HTTP, built when first wanted (mcp/streamable.py builds them).

Importing the MCP SDK costs a CPU second or more, as much as the rest of the daemon's start: a
restart that waited for it was ready in 3 s instead of 1.5. So `serve_mcp` yields a `LazyMcp` at
once. It imports and builds the SDK's app in a worker thread when asked to (`prepare()`, which the
daemon calls once ready) or when the first /mcp request arrives, which then waits for it: /mcp
answers whenever /readyz says ready, at worst a second later.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Protocol

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from memento_sessions.rpc import Registry
from memento_sessions.settings import Settings

IDLE_TIMEOUT = 30 * 60.0  # seconds without a request before a session expires: the SDK's default


class SessionManager(Protocol):
    """What the SDK's session manager must do here: run while /mcp is served."""

    def run(self) -> AbstractAsyncContextManager[None]: ...


Build = Callable[[], tuple[SessionManager, ASGIApp]]


class LazyMcp:
    """The `/mcp` ASGI app: built in a worker thread when first wanted, its requests waiting until then."""

    def __init__(self, build: Build) -> None:
        self._build = build
        self._wanted = anyio.Event()
        self._built = anyio.Event()
        self._app: ASGIApp | None = None

    def prepare(self) -> None:
        """Start building now rather than at the first request; safe to call twice."""
        self._wanted.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._wanted.set()
            await self._built.wait()
        assert self._app is not None
        await self._app(scope, receive, send)

    async def run(self) -> None:
        """Build when wanted, then run the SDK's session manager until cancelled."""
        await self._wanted.wait()
        # A daemon stopped mid-build stops without waiting for the imports to end.
        manager, app = await anyio.to_thread.run_sync(self._build, abandon_on_cancel=True)
        # The daemon froze what it had built before serving (docs/bridge.md, "Garbage collection"); the SDK's
        # objects, built later, live as long: frozen too, they stay out of full collections.
        gc.freeze()
        async with manager.run():
            self._app = app
            self._built.set()
            await anyio.sleep_forever()


def build_streamable(settings: Settings, registry: Registry, idle_timeout: float) -> tuple[SessionManager, ASGIApp]:
    """Import the SDK (in the calling worker thread) and build the `/mcp` app."""
    from memento_sessions.mcp.streamable import build

    return build(settings, registry, idle_timeout)


@asynccontextmanager
async def serve_mcp(settings: Settings, registry: Registry,
                    idle_timeout: float = IDLE_TIMEOUT) -> AsyncIterator[LazyMcp]:
    """The `/mcp` ASGI app, its SDK built when first wanted and its session manager run until exit.

    Sessions idle for `idle_timeout` seconds expire; each agent keeps at most MEMENTO_MCP_MAX_SESSIONS.
    """
    mcp = LazyMcp(partial(build_streamable, settings, registry, idle_timeout))
    async with anyio.create_task_group() as tg:
        tg.start_soon(mcp.run)
        yield mcp
        tg.cancel_scope.cancel()
