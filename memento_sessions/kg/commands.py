"""`memento-sessions kg load FILE` and `memento-sessions prune`, run against the configured backends."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import anyio

from memento_sessions.backends import UNAVAILABLE, open_backends
from memento_sessions.checkpoints.retention import PruneReport, prune
from memento_sessions.endpoints import resolve
from memento_sessions.kg.graph import Graphs
from memento_sessions.kg.loader import BATCH, BadRecord, EdgeRecord, NodeRecord, load_file, upsert
from memento_sessions.settings import Settings

NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # as in tokens (auth.py)

def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `kg` and `prune` sub-commands."""
    kg = sub.add_parser("kg", help="the codebase knowledge graph in FalkorDB")
    kg_sub = kg.add_subparsers(dest="kg_command", required=True, metavar="COMMAND")
    load = kg_sub.add_parser("load", help="load nodes and edges from a JSON Lines file (nothing is written "
                             "if any line is bad)")
    load.add_argument("file", type=Path, help='JSON Lines: {"node": {...}} or {"edge": {...}} per line')
    load.add_argument("--namespace", default="default", type=_namespace, help="namespace (default: default)")
    load.add_argument("--data-dir", help="data directory of a running daemon's embedded servers")
    load.set_defaults(func=kg_load)
    pruner = sub.add_parser("prune", help="run the retention jobs once now: old KG anchors and old "
                            "failure-snapshot partitions")
    pruner.add_argument("--data-dir", help="data directory of a running daemon's embedded servers")
    pruner.set_defaults(func=prune_now)


def _namespace(value: str) -> str:
    if not NAMESPACE.match(value):
        raise argparse.ArgumentTypeError("a namespace is 1..64 chars of [A-Za-z0-9_-]")
    return value


def kg_load(args: argparse.Namespace, settings: Settings) -> int:
    """Validate the whole file, then upsert it; a bad line exits 1 with its number."""
    try:
        nodes, edges = load_file(args.file)
    except (BadRecord, OSError, UnicodeDecodeError) as exc:
        print(f"memento-sessions kg load: {args.file}: {exc} (nothing was written)", file=sys.stderr)
        return 1
    try:
        counts = anyio.run(_load, settings, args.namespace, nodes, edges)
    except UNAVAILABLE as exc:
        return _unavailable("kg load", exc)
    print(f"loaded {counts[0]} nodes and {counts[1]} edges into namespace {args.namespace}")
    return 0


async def _load(settings: Settings, namespace: str, nodes: list[NodeRecord],
                edges: list[EdgeRecord]) -> tuple[int, int]:
    endpoints = resolve(settings)
    async with open_backends(settings, endpoints.redis_url, endpoints.postgres_dsn) as backends:
        graph = await Graphs(backends).get(namespace)
        show = _progress if len(nodes) + len(edges) > 2 * BATCH else None
        counts = await upsert(graph, nodes, edges, show)
    if show is not None:
        print(file=sys.stderr)
    return counts


def _progress(done: int, total: int) -> None:
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"kg load: {done}/{total} records ({100 * done // total}%)", end=end, file=sys.stderr, flush=True)


def prune_now(args: argparse.Namespace, settings: Settings) -> int:
    """Run both retention jobs once and print what they removed."""
    try:
        report = anyio.run(_prune, settings)
    except UNAVAILABLE as exc:
        return _unavailable("prune", exc)
    print(f"anchors removed: {report.anchors_removed}"
          + "".join(f"\n  {ns}: {count}" for ns, count in sorted(report.anchors.items()) if count))
    print(f"snapshot partitions dropped: {len(report.partitions)}"
          + "".join(f"\n  {name}" for name in report.partitions))
    return 0


def _unavailable(command: str, exc: BaseException) -> int:
    print(f"memento-sessions {command}: backend unavailable: {exc}", file=sys.stderr)
    return 1


async def _prune(settings: Settings) -> PruneReport:
    endpoints = resolve(settings)
    async with open_backends(settings, endpoints.redis_url, endpoints.postgres_dsn) as backends:
        return await prune(backends, None, settings)
