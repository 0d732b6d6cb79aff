"""The `memento-sessions` command line."""

from __future__ import annotations

import sys

# Nothing but `sys` at import, not even argparse or typing: `memento-sessions hook` runs once per agent tool
# call and must start fast, so every command imports what it needs when it runs. (mypy takes any name
# TYPE_CHECKING as true.)
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence

    from memento_sessions.settings import Settings

DATA_DIR_HELP = ("data directory of the running daemon whose embedded servers to probe (MEMENTO_DATA_DIR, "
                 "default ./.memento); not needed when MEMENTO_REDIS_URL and MEMENTO_POSTGRES_DSN are set")
MAIN_EPILOG = """\
quick start:
  memento-sessions serve &                         # embedded Redis+FalkorDB and Postgres in ./.memento
  export MEMENTO_TOKEN=$(memento-sessions token --agent planner)
  memento-sessions check                           # exit 0 when every backend answers

`memento-sessions COMMAND --help` tells more about each command.
"""
SERVE_EPILOG = """\
Without MEMENTO_REDIS_URL (and MEMENTO_POSTGRES_DSN) the daemon runs its own redis-server with
FalkorDB and its own Postgres under the data dir, on loopback only and behind generated passwords
(kept 0600 in the data dir). MEMENTO_POSTGRES_DSN=off runs without failure snapshots.
SIGTERM or Ctrl-C stops it gracefully.

examples:
  memento-sessions serve
  MEMENTO_REDIS_URL=redis://:pw@falkordb:6379/0 MEMENTO_POSTGRES_DSN=postgresql://... memento-sessions serve
"""
TOKEN_EPILOG = """\
Run it where the daemon runs (or pass its --data-dir): it refuses when it finds no daemon's secret,
rather than printing a token the daemon would reject.

examples:
  memento-sessions token --agent planner
  memento-sessions token --agent ci-bot --namespace team-a --scope sessions:read --ttl 3600
"""
CHECK_EPILOG = """\
example (a container's health check):
  memento-sessions check --data-dir /var/lib/memento || exit 1
"""


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import anyio

    from memento_sessions.server.daemon import Daemon

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
    from memento_sessions.auth import issue_token
    from memento_sessions.embedded.datadir import existing_auth_secret

    secret = settings.auth_secret or existing_auth_secret(settings.data_dir)
    if secret is None:
        # a secret made up here would sign tokens that no daemon accepts
        print(f"memento-sessions token: no daemon's data dir at {settings.data_dir.resolve()} (it has no "
              "auth_secret); run this where `memento-sessions serve` runs, pass its --data-dir, or set "
              "MEMENTO_AUTH_SECRET to the daemon's secret", file=sys.stderr)
        return 2
    try:
        print(issue_token(secret, args.agent, args.namespace, " ".join(args.scope), args.ttl))
    except ValueError as exc:
        print(f"memento-sessions token: {exc}", file=sys.stderr)
        return 2
    return 0


def _ttl(value: str) -> int:
    """--ttl: a whole, positive number of seconds (a token that is born expired is a mistake)."""
    import argparse

    try:
        seconds = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of seconds") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {seconds}")
    return seconds


def _check(args: argparse.Namespace, settings: Settings) -> int:
    import anyio

    from memento_sessions.server.check import check

    return anyio.run(check, settings)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command and its --help."""
    import argparse

    from memento_sessions import __version__

    parser = argparse.ArgumentParser(
        prog="memento-sessions", formatter_class=_raw(), epilog=MAIN_EPILOG,
        description="Real-time coordination daemon for swarms of AI agents. "
        "Configuration comes from MEMENTO_* environment variables (and .env); see the README.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(sub)
    _add_token(sub)
    check = sub.add_parser("check", help="exit 0 when every backend answers, 1 otherwise (for probes)",
                           description="Probe Redis, FalkorDB and Postgres once and print one line each; "
                           "exit 0 when all answer, 1 when one does not, 2 when no daemon or URL is found.",
                           epilog=CHECK_EPILOG, formatter_class=_raw())
    check.add_argument("--data-dir", help=DATA_DIR_HELP)
    check.set_defaults(func=_check)
    for register in _extra_commands():
        register(sub)
    return parser


def _raw() -> type[argparse.HelpFormatter]:
    """The help formatter that keeps the epilogs' line breaks (argparse is imported only when parsing)."""
    import argparse

    return argparse.RawDescriptionHelpFormatter


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="run the daemon (starts embedded Redis+FalkorDB and Postgres "
                           "unless MEMENTO_REDIS_URL / MEMENTO_POSTGRES_DSN are set)",
                           description="Run the daemon: WebSocket JSON-RPC on /ws, MCP on /mcp, /metrics, "
                           "/healthz and /readyz, all on one port.", epilog=SERVE_EPILOG, formatter_class=_raw())
    serve.add_argument("--host", help="listen address (MEMENTO_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (MEMENTO_PORT, default 8765; 0 picks a free one)")
    serve.add_argument("--data-dir", help="data directory of the embedded servers and of the token secret "
                       "(MEMENTO_DATA_DIR, default ./.memento)")
    serve.set_defaults(func=_serve)


def _add_token(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from memento_sessions.auth import DEFAULT_SCOPE, SCOPES

    token = sub.add_parser("token", help="print a signed token (JWT) for an agent",
                           description="Print a token (JWT) signed with the daemon's secret: MEMENTO_AUTH_SECRET, "
                           "else the one the daemon generated in its data dir.", epilog=TOKEN_EPILOG,
                           formatter_class=_raw())
    token.add_argument("--agent", required=True, help="agent id, the token's subject (1..128 chars of "
                       "[A-Za-z0-9._:-])")
    token.add_argument("--namespace", default="default", help="tenant namespace the token is confined to "
                       "(default: default)")
    token.add_argument("--scope", nargs="+", default=DEFAULT_SCOPE.split(), choices=SCOPES, metavar="SCOPE",
                       help=f"one or more of {', '.join(SCOPES)} (default: {DEFAULT_SCOPE})")
    token.add_argument("--ttl", type=_ttl, default=86400, metavar="SECONDS",
                       help="lifetime in seconds, more than 0 (default 86400: one day)")
    token.add_argument("--data-dir", help="the daemon's data directory, where its secret is (MEMENTO_DATA_DIR, "
                       "default ./.memento)")
    token.set_defaults(func=_token)


def _extra_commands() -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    """Commands that live beside their feature (kg, prune, mcp)."""
    from memento_sessions.checkpoints.commands import register as prune_command
    from memento_sessions.cli.hook import register as hook_command
    from memento_sessions.cli.ingest import register as ingest_command
    from memento_sessions.cli.session import register as session_commands
    from memento_sessions.cli.usage import register as usage_command
    from memento_sessions.kg.commands import register as kg_commands
    from memento_sessions.server.stdio import register as mcp_command

    return [kg_commands, prune_command, mcp_command, ingest_command, hook_command, session_commands, usage_command]


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    names = ("host", "port", "data_dir")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["hook"] and not {"-h", "--help"} & set(given):  # the hook's lean path: see cli/hook.py
        from memento_sessions.cli.hook import leave, run_hook

        code = run_hook(given[1:])
        if argv is None:  # the console script's process: done, without the interpreter's teardown
            leave(code)
        return code
    from memento_sessions.errors import MementoError

    try:
        return _run(given)
    except KeyboardInterrupt:
        return 130
    except (MementoError, ModuleNotFoundError, OSError, BaseExceptionGroup) as exc:
        return failed(exc)


def failed(exc: BaseException) -> int:
    """A failed command's exit code, after one line on stderr (no traceback); what is a bug is raised again."""
    from memento_sessions.errors import ConfigError, DataDirLocked, MementoError

    line = None
    if isinstance(exc, ModuleNotFoundError):  # a daemon command on the light install: name the extra it needs
        from memento_sessions.cli.extras import missing_extra

        line = missing_extra(exc)
    elif isinstance(exc, (ConfigError, DataDirLocked, MementoError)):
        line = str(exc)
    elif broken_pipe(exc):  # the reader went away (`session list | head -1`): done, quietly, as `cat` is
        return quiet_exit()
    elif isinstance(exc, OSError):
        line = f"cannot connect: {exc}"  # one line, not a traceback
    if line is None:
        raise exc
    print(f"memento-sessions: {line}", file=sys.stderr)
    return 2 if isinstance(exc, (ModuleNotFoundError, ConfigError, DataDirLocked)) else 1


def broken_pipe(exc: BaseException) -> bool:
    """A BrokenPipeError, alone or as all an exception group holds (raised inside a task group)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(broken_pipe(inner) for inner in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


def quiet_exit() -> int:
    """141 (128 + SIGPIPE), as a shell reports a command its pipe's reader left; stdout now points at
    /dev/null, so the interpreter's last flush finds nowhere to fail."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def _run(given: list[str]) -> int:
    """The command's code: settings loaded (but for an ingest that needs none), logging set up, then run."""
    if given[:1] == ["ingest"] and not {"-h", "--help"} & set(given):
        from memento_sessions.cli.ingest import quick_main

        quick = quick_main(given[1:])
        if quick is not None:
            return quick
    from memento_sessions.logs import configure_logging
    from memento_sessions.settings import load_settings

    args = build_parser().parse_args(given)
    settings = load_settings(**_overrides(args))
    configure_logging(settings.log_format, settings.log_level)
    code: int = args.func(args, settings)
    return code


if __name__ == "__main__":
    sys.exit(main())
