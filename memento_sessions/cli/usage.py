"""`memento-sessions usage [--session ID | --agent A] [--json]`: what the agents cost, over the daemon's /ws.

Without --session or --agent it prints the namespace's totals. A table is for people: the totals, then one
line per run (one prompt's turn); `--json` prints `usage.get`'s result as it comes, for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from memento_sessions.cli.session import cli_token, daemon_url, table
from memento_sessions.client import Client
from memento_sessions.errors import RpcError
from memento_sessions.settings import Settings

RUN_COLUMNS = ("startedAt", "sessionId", "model", "inputTokens", "outputTokens", "cacheReadTokens",
               "cacheCreationTokens", "toolCalls", "durationMs", "cost")
TOTAL_FIELDS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheCreationTokens", "toolCalls", "apiCalls",
                "runs", "durationMs")


def dollars(cost: float | None) -> str:
    """A cost for people: `unknown` where the source gave none (no price is guessed)."""
    return "unknown" if cost is None else f"${cost:.4f}"


def render(result: dict[str, Any]) -> str:
    """The totals, the sources they come from, and the runs of one page as a table."""
    totals = result["totals"]
    unknown = f" ({totals['costUnknownRuns']} runs without a cost)" if totals["costUnknownRuns"] else ""
    lines = [f"source: {totals['source'] or '-'}; cost: {dollars(totals['costUsd'])}{unknown}",
             "  ".join(f"{name}: {totals[name]:,}" for name in TOTAL_FIELDS)]
    for source, other in result["bySource"].items():
        if source != totals["source"]:
            lines.append(f"also reported by {source}: {other['inputTokens'] + other['outputTokens']:,} tokens, "
                         f"cost {dollars(other['costUsd'])}")
    if result["runs"]:
        rows = [{**run, "cost": dollars(run["costUsd"])} for run in result["runs"]]
        lines += ["", table(rows, RUN_COLUMNS)]
    if result.get("nextCursor"):
        lines.append(f"more runs: --cursor '{result['nextCursor']}'")
    return "\n".join(lines)


async def run(settings: Settings, args: argparse.Namespace) -> int:
    params = {"sessionId": args.session, "agentId": args.agent, "since": args.since, "cursor": args.cursor,
              "limit": args.limit}
    async with Client(daemon_url(settings), cli_token(settings, args.namespace), reconnect=False) as client:
        try:
            result = await client.call("usage.get", {k: v for k, v in params.items() if v is not None})
        except RpcError as exc:
            print(f"memento-sessions usage: {exc.message} ({exc.code})", file=sys.stderr)
            return 1
    print(json.dumps(result) if args.json else render(result))
    return 0


def _usage(args: argparse.Namespace, settings: Settings) -> int:
    return anyio.run(run, settings, args)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `usage` to the command line."""
    parser = sub.add_parser("usage", help="tokens, tool calls, time and cost per run, session, agent or namespace",
                            description="What the agents cost, from the daemon running on the data dir: a "
                            "session's or an agent's totals and runs, or the namespace's totals.")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--session", help="a session's usage and runs")
    which.add_argument("--agent", help="an agent's usage and runs across sessions")
    parser.add_argument("--since", help="only runs started at or after this ISO 8601 time (with a zone)")
    parser.add_argument("--cursor", help="the next page: the cursor a previous page printed")
    parser.add_argument("--limit", type=int, help="runs per page (1..500, default 100)")
    parser.add_argument("--namespace", default="default", help="namespace (ignored with MEMENTO_TOKEN: the token's)")
    parser.add_argument("--data-dir", help="the daemon's data dir (MEMENTO_DATA_DIR, default ./.memento)")
    parser.add_argument("--json", action="store_true", help="print usage.get's JSON for scripts instead of tables")
    parser.set_defaults(func=_usage)
