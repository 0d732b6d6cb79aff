"""`memento-sessions mcp`: the MCP tools on stdin/stdout, as the agent of MEMENTO_TOKEN (mcp/stdio.py).

An MCP client spawns this command. It opens the same backends as the daemon (the configured URLs,
else those of the daemon running on the data directory) and the same services, so its tools run
the daemon's methods against the daemon's data.
"""

from __future__ import annotations

import argparse

import anyio

from memento_sessions.auth import Identity
from memento_sessions.endpoints import resolve
from memento_sessions.mcp.stdio import caller, serve
from memento_sessions.settings import Settings

EPILOG = """\
An MCP client's configuration, for example:
  {"command": "memento-sessions", "args": ["mcp", "--data-dir", "/path/to/.memento"],
   "env": {"MEMENTO_TOKEN": "<the output of memento-sessions token --agent my-agent>"}}
The daemon (`memento-sessions serve`) must be running on that data dir, unless MEMENTO_REDIS_URL
and MEMENTO_POSTGRES_DSN point at the backends.
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `mcp` sub-command."""
    mcp = sub.add_parser("mcp", help="serve the MCP tools on stdin/stdout as the agent of MEMENTO_TOKEN "
                         "(for MCP clients that spawn their servers)", epilog=EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Serve the MCP tools over stdio, as the agent whose token is in "
                         "MEMENTO_TOKEN, on the same data as the running daemon.")
    mcp.add_argument("--data-dir", help="data directory of the running daemon whose embedded servers to use "
                     "(MEMENTO_DATA_DIR, default ./.memento)")
    mcp.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Verify the token, then serve until the client closes stdin."""
    anyio.run(serve_stdio, settings, caller(settings))
    return 0


async def serve_stdio(settings: Settings, identity: Identity) -> None:
    """The daemon's backends and services, with the tools on stdio as `identity`."""
    from memento_sessions.backends import open_backends  # heavy (drivers, MCP SDK): not for other commands
    from memento_sessions.server.services import open_services

    endpoints = resolve(settings)
    async with open_backends(settings, endpoints.redis_url, endpoints.postgres_dsn,
                             endpoints.falkordb_url) as backends, \
            open_services(settings, backends, endpoints.redis_url) as services:
        await serve(services.registry, identity, settings.mcp_rate_limit)
