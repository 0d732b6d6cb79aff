"""The SDK's streamable-HTTP app for `/mcp`, behind bearer auth and DNS-rebinding protection.

Every request is authenticated here, before the SDK sees it: a missing, expired or forged token
gets 401 and nothing else happens. A good token's identity is put in `mcp_server.CALLER` for the
tools (the SDK carries the request's context to the session task that runs them) and in
`scope["user"]`, which binds each MCP session to the principal that opened it: another token
presenting that session id gets 404, as if it did not exist.

This module imports the MCP SDK (a CPU second): only `mcp/http.py`'s lazy app imports it, when /mcp
is first wanted.
"""

from __future__ import annotations

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from memento_sessions.auth import AuthError, Identity, bearer, verify_token
from memento_sessions.embedded.datadir import auth_secret
from memento_sessions.mcp.quota import SessionQuota
from memento_sessions.mcp.tools import CALLER, build_server
from memento_sessions.rpc import Registry
from memento_sessions.settings import Settings

PATH = "/mcp"


class BearerAuth:
    """ASGI middleware: verify the bearer token, then run the request as its identity, within its agent's
    MCP session quota."""

    def __init__(self, app: ASGIApp, secret: str, quota: SessionQuota) -> None:
        self.app = app
        self.secret = secret
        self.quota = quota

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = bearer(Headers(scope=scope).get("authorization"))
        try:
            identity = verify_token(self.secret, raw)
        except AuthError as exc:
            await unauthorized(str(exc))(scope, receive, send)
            return
        scope["user"] = AuthenticatedUser(principal(identity, raw or ""))
        reset = CALLER.set(identity)
        try:
            await self.quota.serve((identity.namespace, identity.agent_id), scope, receive, send)
        finally:
            CALLER.reset(reset)


def principal(identity: Identity, raw: str) -> AccessToken:
    """The SDK's view of the caller; namespace and agent together own an MCP session."""
    return AccessToken(token=raw, client_id=f"{identity.namespace}/{identity.agent_id}",
                       scopes=sorted(identity.scopes), subject=identity.agent_id)


def unauthorized(reason: str) -> JSONResponse:
    """401 with the RFC 6750 challenge."""
    challenge = f'Bearer realm="memento-sessions", error="invalid_token", error_description="{reason}"'
    return JSONResponse({"error": "invalid_token", "error_description": reason}, status_code=401,
                        headers={"WWW-Authenticate": challenge})


LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def transport_security(settings: Settings) -> TransportSecuritySettings:
    """Host and Origin must name this daemon: its loopback names on any port (a published port need not be
    ours: `docker run -p 8766:8765`), its configured host on its port, or one of MEMENTO_MCP_ALLOWED_HOSTS
    (a reverse proxy's public name), exactly as given. A DNS-rebinding page cannot be served under a loopback name.

    With MEMENTO_PORT=0 the port is picked at bind time, after this is built, so any port is accepted.
    """
    port = str(settings.port) if settings.port else "*"
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    hosts = list(dict.fromkeys([*LOOPBACK, *(f"{name}:*" for name in LOOPBACK), f"{host}:{port}"]))
    hosts += settings.extra_mcp_hosts
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"{scheme}://{name}" for name in hosts for scheme in ("http", "https")],
    )


def build(settings: Settings, registry: Registry, idle_timeout: float) -> tuple[StreamableHTTPSessionManager, ASGIApp]:
    """The SDK's session manager (to be run) and the authenticated `/mcp` app in front of it.

    Sessions idle for `idle_timeout` seconds expire; each agent keeps at most MEMENTO_MCP_MAX_SESSIONS.
    """
    server = build_server(registry, rate_limit=settings.mcp_rate_limit)
    app = server.streamable_http_app(streamable_http_path=PATH, transport_security=transport_security(settings),
                                     host=settings.host, session_idle_timeout=idle_timeout)
    quota = SessionQuota(app, settings.mcp_max_sessions, idle_timeout)
    secret = settings.auth_secret or auth_secret(settings.data_dir)
    return server.session_manager, BearerAuth(app, secret, quota)
