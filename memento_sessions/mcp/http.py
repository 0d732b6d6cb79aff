"""`/mcp`: the MCP tools over streamable HTTP, built on the first request (mcp/streamable.py builds them).

Importing the MCP SDK costs a CPU second or more, more than the rest of the daemon's start: a daemon
that imported it at start took twice as long to be ready. So `serve_mcp` yields a `LazyMcp` at once,
which imports and builds the SDK's app in a worker thread when the first /mcp request arrives; that
request (and any other meanwhile) waits for it. /mcp therefore answers whenever /readyz says ready,
the first time a second or so later; and a daemon whose agents use only /ws never pays for it.
Built in the background once ready instead, it would spend that second under the first clients'
requests, and in every daemon.
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
    """The `/mcp` ASGI app: built in a worker thread on the first request, requests waiting until then."""

    def __init__(self, build: Build) -> None:
        self._build = build
        self._wanted = anyio.Event()
        self._built = anyio.Event()
        self._app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._wanted.set()
            await self._built.wait()
        assert self._app is not None
        await self._app(scope, receive, send)

    async def run(self) -> None:
        """Build on the first request, then run the SDK's session manager until cancelled.

        A build that fails (the SDK missing or broken) ends the daemon, as it ended the daemon's start before.
        """
        await self._wanted.wait()
        # A daemon stopped mid-build shuts its servers down at once; the process exits when the imports end.
        manager, app = await anyio.to_thread.run_sync(self._build, abandon_on_cancel=True)
        # The daemon froze what it had built before serving (docs/bridge.md, "Garbage collection"); the SDK's
        # objects, built later, live as long: frozen too, they stay out of full collections. (So do the
        # objects of requests in flight now: freed by their reference counts as ever, only a cycle among
        # them would be kept.)
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
    """The `/mcp` ASGI app, its SDK built on the first request and its session manager run until exit.

    Sessions idle for `idle_timeout` seconds expire; each agent keeps at most MEMENTO_MCP_MAX_SESSIONS.
    """
    mcp = LazyMcp(partial(build_streamable, settings, registry, idle_timeout))
    async with anyio.create_task_group() as tg:
        tg.start_soon(mcp.run)
        yield mcp
        tg.cancel_scope.cancel()
