"""The one HTTP port: /ws, /mcp, /hooks/<agent>, /v1/logs and /v1/metrics (OTLP), /metrics, /healthz and /readyz."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from memento_sessions.dashboard import routes as dashboard_routes
from memento_sessions.limits import FOREGROUND
from memento_sessions.rpc import LARGE_FRAME
from memento_sessions.server.health import Health, log_ready
from memento_sessions.server.hooks import hook_routes
from memento_sessions.usage.receiver import OtlpReceiver
from memento_sessions.ws.gateway import Gateway


def build_app(gateway: Gateway, health: Health, mcp: ASGIApp | None = None,
              otlp: OtlpReceiver | None = None) -> ASGIApp:
    """The daemon's ASGI app: `/ws` straight to the gateway, everything else through Starlette's router.

    An HTTP request of a small body counts as a small request in flight (limits.Foreground) while it runs:
    large work waits for it between two of its parts, as for a small /ws request. Once first ready, the
    daemon logs what its start cost.
    """
    routes = build_routes(gateway, health, mcp, otlp)
    health.when_ready(log_ready)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        # The hot path skips the router's per-message send wrappers: one dict lookup instead.
        if scope["type"] == "websocket" and scope["path"] == "/ws":
            await gateway(scope, receive, send)
        else:
            with FOREGROUND.serving(small_body(scope)):
                await routes(scope, receive, send)

    return app


def small_body(scope: Scope) -> bool:
    """An HTTP request whose Content-Length (none: a GET, say) is under LARGE_FRAME."""
    if scope["type"] != "http":
        return False
    length = next((value for name, value in scope["headers"] if name == b"content-length"), b"0")
    return length.isdigit() and int(length) < LARGE_FRAME


def build_routes(gateway: Gateway, health: Health, mcp: ASGIApp | None = None,
                 otlp: OtlpReceiver | None = None) -> Starlette:
    """Route the daemon's endpoints; `mcp` serves exactly /mcp when given, `otlp` /v1/logs and /v1/metrics."""

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
        *hook_routes(gateway.registry, gateway.secret, gateway.rate_limit),
        *dashboard_routes(),
    ]
    if mcp is not None:
        # A Route, not a Mount: `POST /mcp` is served as it is instead of redirected to `/mcp/`.
        routes.append(Route("/mcp", mcp))
    if otlp is not None:
        routes += otlp.routes()
    return Starlette(routes=routes)
