"""`memento-sessions session ...`: look at and steer sessions from a shell, over the running daemon's /ws.

The commands are a client of the daemon like any other (memento_sessions.client.Client): they find it as
every command does (the data dir's runtime.json, else MEMENTO_URL, else MEMENTO_HOST / MEMENTO_PORT), and
act as MEMENTO_TOKEN when it is set, else sign a token with the data dir's secret for the namespace given.
Tables are for people; `--json` prints the results as they come from the daemon, for scripts. `suspend` run
in a git work tree stores its uncommitted work with the session first, and `checkout` applies it elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from memento_sessions.auth import issue_token
from memento_sessions.cli.wire import daemon_url as find_daemon
from memento_sessions.client import Client
from memento_sessions.embedded.datadir import existing_auth_secret
from memento_sessions.errors import ConfigError, Conflict, Forbidden, NotFound, RpcError
from memento_sessions.settings import Settings

Action = Callable[[Client, argparse.Namespace], Awaitable[Any]]
LIST_COLUMNS = ("sessionId", "status", "state", "seq", "agents", "updatedAt")


def daemon_url(settings: Settings) -> str:
    """Every command's rule (cli/wire.py\'s daemon_url): the data dir's runtime.json, else MEMENTO_URL, else
    MEMENTO_HOST / MEMENTO_PORT."""
    return find_daemon(str(settings.data_dir), os.environ.get("MEMENTO_URL"), settings.host, settings.port)


def cli_token(settings: Settings, namespace: str, admin: bool = False) -> str:
    """MEMENTO_TOKEN whenever it is set (every command acts as it: its namespace, its scopes; a command its
    scopes do not cover is refused by the daemon), else a short-lived token signed with the data dir's secret."""
    if settings.token:
        return settings.token
    secret = settings.auth_secret or existing_auth_secret(settings.data_dir)
    if secret is None:
        raise ConfigError(f"no MEMENTO_TOKEN and no daemon's secret in {settings.data_dir}")
    scope = "sessions:read sessions:write" + (" admin" if admin else "")
    return issue_token(secret, "cli", namespace, scope, 3600)


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """Aligned plain-text columns; a broken session's row is marked with `!`."""
    cells = [[str(row.get(name, "")) for name in columns] for row in rows]
    widths = [max([len(name), *(len(line[i]) for line in cells)]) for i, name in enumerate(columns)]
    lines = ["  " + "  ".join(name.upper().ljust(width) for name, width in zip(columns, widths, strict=True))]
    for row, line in zip(rows, cells, strict=True):
        mark = "!" if row.get("state") == "broken" else " "
        lines.append(f"{mark} " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def listed(session: dict[str, Any]) -> dict[str, Any]:
    return {**session, "agents": ",".join(session.get("agentIds", []))}


async def list_(client: Client, args: argparse.Namespace) -> Any:
    params = {"status": args.status, "agentId": args.agent, "limit": args.limit}
    result = await client.call("session.list", {k: v for k, v in params.items() if v is not None})
    return result if args.json else table([listed(s) for s in result["sessions"]], LIST_COLUMNS)


async def show(client: Client, args: argparse.Namespace) -> Any:
    params: dict[str, Any] = {"sessionId": args.id}
    params.update({"atSeq": args.at} if args.at is not None else {"condensed": True})
    result = await client.call("session.get", params)
    if args.json:
        return result
    session = result["session"]
    head = [f"{name}: {session.get(name)}" for name in ("sessionId", "status", "state", "seq", "epoch", "agentIds")
            if name in session]
    counts = table([{"type": k, "count": v} for k, v in result["counts"].items()], ("type", "count"))
    moves = table(result["transitions"], ("seq", "from", "to", "actor"))
    return "\n".join([*head, f"perfDelta: {result['perfDelta']}", "", counts, "", moves])


async def diff(client: Client, args: argparse.Namespace) -> Any:
    result = await client.call("session.diff", {"sessionId": args.id, "fromSeq": args.from_seq, "toSeq": args.to_seq})
    if args.json:
        return result
    lines = [f"{args.from_seq} -> {args.to_seq}: {result['stateFrom']} -> {result['stateTo']}, "
             f"{result['events']} events, perfDelta {result['perfDelta']}",
             f"by type: {json.dumps(result['byType'])}", f"entities: {', '.join(result['entitiesChanged'])}",
             f"agents joined: {', '.join(result['agentsJoined']) or '-'}"]
    return "\n".join(lines)


async def fork(client: Client, args: argparse.Namespace) -> Any:
    params = {"sessionId": args.id, "atSeq": args.at, **({"newSessionId": args.new_id} if args.new_id else {})}
    return await client.call("session.fork", params)


def one(method: str) -> Action:
    async def run(client: Client, args: argparse.Namespace) -> Any:
        return await client.call(method, {"sessionId": args.id})
    return run


async def complete(client: Client, args: argparse.Namespace) -> Any:
    return await client.call("session.checkpoint", {"sessionId": args.id, "final": True})


async def tail(client: Client, args: argparse.Namespace) -> Any:
    """Print events after --since; with -f keep following live (the client resubscribes after a cut)."""
    since = args.since
    async for event in client.iter_events(args.id, since):
        print(event_line(event, args.json), flush=True)
        since = int(event["seq"])
    if args.follow:
        async with client.subscribe(args.id, since=since) as feed:
            async for item in feed:
                print(event_line(item.event, args.json), flush=True)
    return None


def event_line(event: dict[str, Any], as_json: bool) -> str:
    if as_json:
        return json.dumps(event, separators=(",", ":"))
    ids = ",".join((event.get("changeInfo") or {}).get("entityIds") or [])
    return f"{event['seq']:>8}  {event.get('timestamp', '')}  {event.get('actor', '')}  {event['type']}  {ids}".rstrip()


async def checkout(client: Client, args: argparse.Namespace) -> Any:
    """Apply the session's stored uncommitted work to --into (default: here), at the HEAD it was made against."""
    from memento_sessions.cli.gitstate import apply, newest_patch

    found = newest_patch([event async for event in client.iter_events(args.id)])
    if isinstance(found, str):
        raise CommandFailed(found)
    head, patch = found
    problem = await anyio.to_thread.run_sync(apply, args.into, head, patch)
    if problem is not None:
        raise CommandFailed(problem)
    return f"applied {len(patch)} bytes of uncommitted work of {args.id} to {args.into} at {head}"


async def suspend(client: Client, args: argparse.Namespace) -> Any:
    """Store the uncommitted work of the work tree (here, or --work-tree) with the session, then suspend it."""
    if args.work:
        await store_work(client, args.id, args.work_tree or ".", explicit=args.work_tree is not None)
    return await client.call("session.suspend", {"sessionId": args.id})


async def store_work(client: Client, session_id: str, root: str, explicit: bool) -> None:
    """The tree's uncommitted work (a clean tree: its HEAD) as the session's `git:patch` events, as the hook
    stores it at Stop: at most MEMENTO_HOOK_PATCH_MAX_BYTES (a larger patch is refused: one event says so),
    git within MEMENTO_HOOK_GIT_TIMEOUT. What became of it is said on stderr; nothing outside a work tree."""
    from memento_sessions.cli.gitstate import git_timeout, patch_events, patch_max, work
    from memento_sessions.cli.spool import now_iso

    limit, timeout = patch_max(), git_timeout()
    if limit <= 0 or timeout <= 0:
        return
    started = anyio.current_time()
    found = await anyio.to_thread.run_sync(work, root, timeout, limit, True)
    if found is None:
        if anyio.current_time() - started >= timeout:
            note(f"the uncommitted work of {root} was not stored: git took longer than MEMENTO_HOOK_GIT_TIMEOUT "
                 f"({timeout:g} s)")
        elif explicit:
            note(f"{root} is not a git work tree with a commit: no uncommitted work stored")
        return
    try:
        await client.call("event.emitBatch", {"sessionId": session_id, "events": patch_events(found, now_iso())})
    except RpcError as exc:
        if exc.code in (NotFound.code, Conflict.code, Forbidden.code):
            return  # not live, completed, not this token's: session.suspend says so
        raise CommandFailed(f"the uncommitted work was not stored: {exc.message} ({exc.code}); the session was "
                            "not suspended (--no-work suspends it without)") from exc
    note(stored_note(found, root))


def stored_note(found: dict[str, Any], root: str) -> str:
    if found.get("refused"):
        return f"the uncommitted work of {root} was not stored: larger than {found.get('max')} bytes " \
               "(MEMENTO_HOOK_PATCH_MAX_BYTES)"
    if not found["bytes"]:
        return f"{root} has no uncommitted work: stored its HEAD {found['head']}"
    return f"stored {found['bytes']} bytes of uncommitted work of {root} at {found['head']}"


def note(line: str) -> None:
    print(f"memento-sessions session suspend: {line}", file=sys.stderr)


class CommandFailed(Exception):
    """A command that cannot do what it was asked, and why (printed, exit 1)."""


async def run(settings: Settings, args: argparse.Namespace) -> int:
    token = cli_token(settings, args.namespace, admin=args.action == "clear")
    async with Client(daemon_url(settings), token, reconnect=args.action == "tail") as client:
        try:
            result = await args.session_func(client, args)
        except RpcError as exc:
            print(f"memento-sessions session {args.action}: {exc.message} ({exc.code})", file=sys.stderr)
            return 1
        except CommandFailed as exc:
            print(f"memento-sessions session {args.action}: {exc}", file=sys.stderr)
            return 1
    if result is not None:
        print(result if isinstance(result, str) else json.dumps(result, indent=None if args.json else 2))
    return 0


def _session(args: argparse.Namespace, settings: Settings) -> int:
    return anyio.run(run, settings, args)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `session` and its sub-commands to the command line."""
    parser = sub.add_parser("session", help="list, show, tail, diff, fork, suspend, resume, complete, clear or "
                            "check out sessions",
                            description="Look at and steer the sessions of the daemon running on the data dir.")
    common_options(parser, {"namespace": "default", "data_dir": None, "json": False})
    parser.set_defaults(func=_session)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("list", help="sessions, newest first")
    p.add_argument("--status", choices=("active", "suspended", "completed", "archived"))
    p.add_argument("--agent")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(session_func=list_)
    p = actions.add_parser("show", help="a session's condensed view, now or --at SEQ")
    p.add_argument("id")
    p.add_argument("--at", type=int)
    p.set_defaults(session_func=show)
    p = actions.add_parser("tail", help="a session's events; -f follows live")
    p.add_argument("id")
    p.add_argument("--since", type=int, default=0)
    p.add_argument("-f", "--follow", action="store_true")
    p.set_defaults(session_func=tail)
    p = actions.add_parser("diff", help="what changed between two seqs")
    p.add_argument("id")
    p.add_argument("from_seq", type=int, metavar="FROM")
    p.add_argument("to_seq", type=int, metavar="TO")
    p.set_defaults(session_func=diff)
    p = actions.add_parser("fork", help="a new session from the events up to --at SEQ")
    p.add_argument("id")
    p.add_argument("--at", type=int, required=True)
    p.add_argument("--new-id", dest="new_id")
    p.set_defaults(session_func=fork)
    p = actions.add_parser("suspend", help="suspend a session, with the uncommitted work of the git work tree here")
    p.add_argument("id")
    p.add_argument("--work-tree", dest="work_tree", metavar="DIR", help="the git work tree whose uncommitted "
                   "work is stored with the session (default: the current directory, when it is one)")
    p.add_argument("--no-work", dest="work", action="store_false", help="store no uncommitted work")
    p.set_defaults(session_func=suspend)
    for name in ("resume", "clear"):
        p = actions.add_parser(name, help=f"{name} a session" + (" (admin scope)" if name == "clear" else ""))
        p.add_argument("id")
        p.set_defaults(session_func=one(f"session.{name}"))
    p = actions.add_parser("complete", help="final checkpoint: the session is completed")
    p.add_argument("id")
    p.set_defaults(session_func=complete)
    p = actions.add_parser("checkout", help="apply the session's stored uncommitted work to a work tree at its HEAD")
    p.add_argument("id")
    p.add_argument("--into", default=".", help="the git work tree (default: the current directory); when it is "
                   "clean and at another commit, that HEAD is checked out first")
    p.set_defaults(session_func=checkout)
    for action in actions.choices.values():  # the same options after the action: `session list --json`
        common_options(action, None)


def common_options(parser: argparse.ArgumentParser, defaults: dict[str, Any] | None) -> None:
    """--namespace, --data-dir and --json, before the action (with their defaults) or after it (an option
    given there wins; one not given leaves the value from before the action: argparse.SUPPRESS)."""
    def default(name: str) -> Any:
        return argparse.SUPPRESS if defaults is None else defaults[name]

    parser.add_argument("--namespace", default=default("namespace"),
                        help="namespace (ignored with MEMENTO_TOKEN: the token's)")
    parser.add_argument("--data-dir", default=default("data_dir"),
                        help="the daemon's data dir (MEMENTO_DATA_DIR, default ./.memento)")
    parser.add_argument("--json", action="store_true", default=default("json"),
                        help="print JSON for scripts instead of tables")
