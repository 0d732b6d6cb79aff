"""The MCP tools on stdin/stdout, as the agent of MEMENTO_TOKEN.

The `memento-sessions mcp` command (server/stdio.py) opens the daemon's backends and services in a
process of its own and hands their registry to `serve` here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memento_sessions.auth import AuthError, Identity, verify_token
from memento_sessions.embedded.datadir import existing_auth_secret
from memento_sessions.errors import ConfigError
from memento_sessions.settings import Settings

if TYPE_CHECKING:
    from memento_sessions.rpc import Registry  # heavy (drivers): the command's parser is built without it


def caller(settings: Settings) -> Identity:
    """The identity of MEMENTO_TOKEN; raises ConfigError when it is missing or not valid."""
    if not settings.token:
        raise ConfigError("MEMENTO_TOKEN is not set (print one with `memento-sessions token --agent ID`)")
    secret = settings.auth_secret or existing_auth_secret(settings.data_dir)
    if secret is None:
        raise ConfigError(f"no MEMENTO_AUTH_SECRET set and no daemon's secret in {settings.data_dir.resolve()} "
                          "(pass the daemon's --data-dir, or set MEMENTO_AUTH_SECRET as the daemon has it)")
    try:
        return verify_token(secret, settings.token)
    except AuthError as exc:
        raise ConfigError(f"invalid MEMENTO_TOKEN: {exc}") from None


async def serve(registry: Registry, identity: Identity, rate_limit: float) -> None:
    """Serve every method of `registry` as an MCP tool on stdio, as `identity`, until stdin closes."""
    from memento_sessions.mcp.tools import build_server  # heavy (the MCP SDK): not for other commands

    await build_server(registry, identity, rate_limit).run_stdio_async()
