"""The one HTTP port: /ws, /mcp, /metrics, /healthz and /readyz."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.types import ASGIApp

from memento_sessions.gateway import Gateway
from memento_sessions.health import Health


def build_app(gateway: Gateway, health: Health, mcp: ASGIApp | None = None) -> Starlette:
    """Route the daemon's endpoints; `mcp` is mounted at /mcp when given."""

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> Response:
        body = {"ready": health.ready, "backends": dict(health.status)}
        return JSONResponse(body, status_code=200 if health.ready else 503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
        WebSocketRoute("/ws", gateway),
    ]
    if mcp is not None:
        routes.append(Mount("/mcp", app=mcp))
    return Starlette(routes=routes)
