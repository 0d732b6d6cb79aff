"""`memento-sessions kg load FILE`, run against the configured backends.

The drivers and the loader are imported when a command runs, not when the parser is built: every
other command (and `--help`) starts without them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from memento_sessions.endpoints import resolve
from memento_sessions.settings import Settings

if TYPE_CHECKING:
    from redis.asyncio import Redis as AsyncRedis

    from memento_sessions.kg.loader import EdgeRecord, NodeRecord

NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # as in tokens (auth.py)
RAW = argparse.RawDescriptionHelpFormatter
DATA_DIR_HELP = ("data directory of the running daemon whose embedded servers to use (default: MEMENTO_DATA_DIR "
                 "or ./.memento); not needed when MEMENTO_REDIS_URL and MEMENTO_POSTGRES_DSN are set")
LOAD_EPILOG = """\
Each line is one record:
  {"node": {"id": "src/app.py::main", "labels": ["Symbol"], "props": {"name": "main"}}}
  {"edge": {"from": "tests/test_app.py::test_main", "to": "src/app.py::main", "type": "TESTS"}}
The whole file is checked first: a bad line exits 1 with its number and nothing is written.
Nodes merge by id, so loading the same file twice changes nothing. After a load into the embedded
Redis, its append-only file is rewritten so that the daemon's next start stays fast.

example:
  memento-sessions kg load graph.jsonl --namespace team-a
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `kg` sub-command."""
    kg = sub.add_parser("kg", help="the codebase knowledge graph in FalkorDB (kg load FILE)",
                        description="Commands on the codebase knowledge graph kept in FalkorDB.")
    kg_sub = kg.add_subparsers(dest="kg_command", required=True, metavar="COMMAND")
    load = kg_sub.add_parser("load", help="load nodes and edges from a JSON Lines file (nothing is written "
                             "if any line is bad)", description="Load nodes and edges into a namespace's "
                             "knowledge graph.", epilog=LOAD_EPILOG, formatter_class=RAW)
    load.add_argument("file", type=Path, help='JSON Lines: {"node": {...}} or {"edge": {...}} per line')
    load.add_argument("--namespace", default="default", type=_namespace,
                      help="tenant namespace whose graph to load into (default: default)")
    load.add_argument("--data-dir", help=DATA_DIR_HELP)
    load.set_defaults(func=kg_load)


def _namespace(value: str) -> str:
    if not NAMESPACE.fullmatch(value):
        raise argparse.ArgumentTypeError("a namespace is 1..64 chars of [A-Za-z0-9_-]")
    return value


def kg_load(args: argparse.Namespace, settings: Settings) -> int:
    """Validate the whole file, then upsert it; a bad line exits 1 with its number."""
    from memento_sessions.backends import UNANSWERED
    from memento_sessions.errors import BadRecord
    from memento_sessions.kg.loader import load_file

    try:
        nodes, edges = load_file(args.file)
    except (BadRecord, OSError, UnicodeDecodeError) as exc:
        print(f"memento-sessions kg load: {args.file}: {exc} (nothing was written)", file=sys.stderr)
        return 1
    try:
        counts = anyio.run(_load, settings, args.namespace, nodes, edges)
    except UNANSWERED as exc:
        return unavailable("kg load", exc)
    print(f"loaded {counts[0]} nodes and {counts[1]} edges into namespace {args.namespace}")
    return 0


async def _load(settings: Settings, namespace: str, nodes: list[NodeRecord],
                edges: list[EdgeRecord]) -> tuple[int, int]:
    from memento_sessions.backends import open_backends
    from memento_sessions.kg.graph import Graphs
    from memento_sessions.kg.loader import BATCH, upsert

    endpoints = resolve(settings)
    async with open_backends(settings, endpoints.redis_url, endpoints.postgres_dsn, endpoints.falkordb_url) as backends:
        graph = await Graphs(backends).get(namespace)
        show = _progress if len(nodes) + len(edges) > 2 * BATCH else None
        counts = await upsert(graph, nodes, edges, show)
        await _graph_changed(backends.redis, namespace)
        if settings.redis_url is None and settings.falkordb_url is None:  # the embedded graphs' server
            await _compact(backends.falkordb.connection)
    if show is not None:
        print(file=sys.stderr)
    return counts


async def _graph_changed(redis: AsyncRedis, namespace: str) -> None:
    """Tell the daemons the namespace's graph changed: each caches what a lease on a file or cluster covers,
    and a new graph version (the coordination library's `mc_graph_changed`) makes their next grant read it
    again. Where no daemon has loaded that library yet, none holds a cache to correct."""
    import uuid

    from redis.exceptions import ResponseError

    from memento_sessions import keys

    try:
        await redis.fcall("mc_graph_changed", 1, keys.lease_keys(namespace).fence, uuid.uuid4().hex)
    except ResponseError as exc:
        if "Function not found" not in str(exc):
            raise


async def _compact(redis: AsyncRedis) -> None:
    """Rewrite the embedded graphs' server's AOF, so that its next start loads the graph fast (a Redis of one's own,
    configured by URL, is left to its operator)."""
    from memento_sessions.embedded.redis import compact_aof

    status = await compact_aof(redis)
    if status != "ok":
        print(f"memento-sessions kg load: rewriting the append-only file failed ({status}); the next start of "
              "the embedded Redis replays the load and takes longer", file=sys.stderr)


def _progress(done: int, total: int) -> None:
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"kg load: {done}/{total} records ({100 * done // total}%)", end=end, file=sys.stderr, flush=True)


def unavailable(command: str, exc: BaseException) -> int:
    """Say which command found a backend unavailable; exit status 1."""
    print(f"memento-sessions {command}: backend unavailable: {exc}", file=sys.stderr)
    return 1
