"""`memento-sessions prune`: the retention jobs run once, now, against the configured backends.

Like the kg commands, the drivers are imported when the command runs, not when the parser is built.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import anyio

from memento_sessions.endpoints import resolve
from memento_sessions.kg.commands import DATA_DIR_HELP, RAW, unavailable
from memento_sessions.settings import Settings

if TYPE_CHECKING:
    from memento_sessions.checkpoints.retention import PruneReport

PRUNE_EPILOG = """\
The daemon runs both jobs on its own (once an hour, on one daemon of a cluster); this runs them now:
KG anchors older than MEMENTO_ANCHOR_MAX_AGE_DAYS (and stub entities no longer linked), and
failure-snapshot partitions older than MEMENTO_SNAPSHOT_MAX_AGE_DAYS. Exit 1 if a backend is down.
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `prune` sub-command."""
    pruner = sub.add_parser("prune", help="run the retention jobs once now: old KG anchors and old "
                            "failure-snapshot partitions", description="Run the retention jobs once and "
                            "print what they removed.", epilog=PRUNE_EPILOG, formatter_class=RAW)
    pruner.add_argument("--data-dir", help=DATA_DIR_HELP)
    pruner.set_defaults(func=prune_now)


def prune_now(args: argparse.Namespace, settings: Settings) -> int:
    """Run both retention jobs once and print what they removed."""
    from memento_sessions.backends import UNANSWERED

    try:
        report = anyio.run(_prune, settings)
    except UNANSWERED as exc:
        return unavailable("prune", exc)
    print(f"anchors removed: {report.anchors_removed}"
          + "".join(f"\n  {ns}: {count}" for ns, count in sorted(report.anchors.items()) if count))
    print(f"stub entities removed: {report.stubs_removed}")
    print(f"snapshot partitions dropped: {len(report.partitions)}"
          + "".join(f"\n  {name}" for name in report.partitions))
    return 0


async def _prune(settings: Settings) -> PruneReport:
    from memento_sessions.backends import open_backends
    from memento_sessions.checkpoints.retention import prune
    from memento_sessions.checkpoints.snapshots import Snapshots
    from memento_sessions.kg.graph import Graphs

    endpoints = resolve(settings)
    async with open_backends(settings, endpoints.redis_url, endpoints.postgres_dsn, endpoints.falkordb_url) as backends:
        return await prune(Graphs(backends), Snapshots(backends.postgres), None, settings)
