"""The `memento-sessions` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import anyio

from memento_sessions import __version__
from memento_sessions.auth import DEFAULT_SCOPE, SCOPES, issue_token
from memento_sessions.embedded.datadir import DataDirLocked, auth_secret
from memento_sessions.errors import ConfigError, MementoError
from memento_sessions.logs import configure_logging
from memento_sessions.settings import Settings, load_settings

Command = Callable[[argparse.Namespace, Settings], int]


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    from memento_sessions.daemon import Daemon

    anyio.run(Daemon(settings).run, backend_options=event_loop_options())
    return 0


def event_loop_options() -> dict[str, object]:
    """uvloop where it is installed (Linux, macOS): the daemon's I/O loop is its hot path."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def _token(args: argparse.Namespace, settings: Settings) -> int:
    secret = settings.auth_secret or auth_secret(settings.data_dir)
    try:
        print(issue_token(secret, args.agent, args.namespace, " ".join(args.scope), args.ttl))
    except ValueError as exc:
        print(f"memento-sessions token: {exc}", file=sys.stderr)
        return 2
    return 0


def _check(args: argparse.Namespace, settings: Settings) -> int:
    from memento_sessions.check import check

    return anyio.run(check, settings)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command and its --help."""
    parser = argparse.ArgumentParser(
        prog="memento-sessions",
        description="Real-time coordination daemon for swarms of AI agents. "
        "Configuration comes from MEMENTO_* environment variables (and .env); see the README.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the daemon (starts embedded Redis+FalkorDB and Postgres "
                           "unless MEMENTO_REDIS_URL / MEMENTO_POSTGRES_DSN are set)")
    serve.add_argument("--host", help="listen address (MEMENTO_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (MEMENTO_PORT, default 8765; 0 picks a free one)")
    serve.add_argument("--data-dir", help="data directory of the embedded servers (MEMENTO_DATA_DIR)")
    serve.set_defaults(func=_serve)
    token = sub.add_parser("token", help="print a signed token (JWT) for an agent")
    token.add_argument("--agent", required=True, help="agent id, the token's subject")
    token.add_argument("--namespace", default="default", help="tenant namespace (default: default)")
    token.add_argument("--scope", nargs="+", default=DEFAULT_SCOPE.split(), choices=SCOPES,
                       help=f"scopes (default: {DEFAULT_SCOPE})")
    token.add_argument("--ttl", type=int, default=86400, help="lifetime in seconds (default 86400)")
    token.add_argument("--data-dir", help="data directory holding the generated secret")
    token.set_defaults(func=_token)
    check = sub.add_parser("check", help="exit 0 when every backend answers, 1 otherwise (for probes)")
    check.add_argument("--data-dir", help="data directory of a running daemon's embedded servers")
    check.set_defaults(func=_check)
    for register in _extra_commands():
        register(sub)
    return parser


def _extra_commands() -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    """Commands that live beside their feature (kg, prune, mcp)."""
    from memento_sessions.kg.commands import register as kg_commands
    from memento_sessions.mcp_stdio import register as mcp_command

    return [kg_commands, mcp_command]


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    names = ("host", "port", "data_dir")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(**_overrides(args))
        configure_logging(settings.log_format, settings.log_level)
        code: int = args.func(args, settings)
    except (ConfigError, DataDirLocked) as exc:
        print(f"memento-sessions: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except MementoError as exc:
        print(f"memento-sessions: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
