"""The run: embedded servers, a daemon process on them, each chosen section timed, then its report (report.py)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import anyio
import redis.asyncio as aioredis

from bench import peers
from bench.daemons import daemon, raise_fd_limit
from bench.harness import Env, Figure
from bench.report import Run, check_markdown_file, show, write_markdown
from bench.sections import SECTIONS, Section
from bench.watch import daemon_gc, delayed_fsyncs, gc_note, quiet, redis_stalls, steal_ms, watch_stalls
from memento_sessions.embedded.postgres import EmbeddedPostgres
from memento_sessions.embedded.redis import EmbeddedRedis
from memento_sessions.logs import configure_logging
from memento_sessions.server.daemon import settle_gc


async def run(args: argparse.Namespace) -> None:
    """Start the servers and the daemon, measure, print."""
    configure_logging("console", "warning")
    raise_fd_limit()  # before the daemon starts: it inherits the limit (the scale sections open 10,000 sockets)
    python = peers.peers_venv() if args.peers else None  # before the servers: the install is not timed
    run_note = Run()
    with tempfile.TemporaryDirectory(prefix="memento-bench-") as tmp, servers(Path(tmp)) as started:
        sessions, graphs, postgres = started
        async with daemon(sessions.url, postgres.url, Path(tmp), falkordb_url=graphs.url) as running:
            client = aioredis.Redis.from_url(sessions.url, decode_responses=True)
            graph_client = aioredis.Redis.from_url(graphs.url, decode_responses=True)
            env = Env(sessions.url, graphs.url, postgres.url, running.port, client, graph_client, args.quick,
                      daemon_pid=running.pid, redis_tcp_url=sessions.tcp_url)
            figures = await measure(env, args.only, run_note)
            if python:
                for figure in await peers.measure(env, python, figures):
                    figure.section = "peers"
                    figures.append(figure)
            run_note.finish()
            await client.aclose()
            await graph_client.aclose()
    show(figures)
    if args.markdown:
        write_markdown(args.markdown, figures, run_note)


@contextmanager
def servers(data: Path) -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis, EmbeddedPostgres]]:
    """The daemon's embedded default, started under `data`: the sessions' Redis without FalkorDB, a
    redis-server with FalkorDB for the graphs, and Postgres; each stopped on exit."""
    sessions, graphs = EmbeddedRedis(data / "redis", falkordb=False), EmbeddedRedis(data / "falkordb", name="falkordb")
    postgres = EmbeddedPostgres(data / "postgres")
    with ExitStack() as started:
        for server in (sessions, graphs, postgres):
            server.start()
            started.callback(server.stop)
        yield sessions, graphs, postgres


async def measure(env: Env, only: list[str] | None, run_note: Run) -> list[Figure]:
    """Every chosen section in registry order, each on a quiet server, its figures judged."""
    figures: list[Figure] = []
    for name, section in SECTIONS.items():
        if not only or name in only:
            run_note.section_started()
            figures += await timed_section(env, name, section)
    return figures


async def timed_section(env: Env, name: str, section: Section) -> list[Figure]:
    """One section's figures, judged; a section that raises is one failed row, and the run goes on."""
    print(f"bench: {name} ... (load average {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    stolen = steal_ms()
    try:
        figures = await watched(env, name, section)
    except Exception as error:  # one section failing leaves the others' figures worth their table
        print(f"bench: {name}: the section failed: {error!r:.500}", file=sys.stderr, flush=True)
        figures = [Figure(f"{name}: the section failed ({type(error).__name__})", "", math.nan, None,
                          extra={"failed": 1.0})]
    stolen = steal_ms() - stolen
    for figure in figures:
        figure.section = name
        figure.extra["section_steal_ms"] = stolen  # the host's share of this figure's time
        figure.judge()
        if figure.extra.get("failed"):
            figure.met = False
    return figures


async def watched(env: Env, name: str, section: Section) -> list[Figure]:
    """The section's figures on quiet servers; prints its time, the host's steal, the daemon's GC pauses and
    Redis's stalls."""
    settle_gc()  # as the daemon does after start-up: in-process sections run with the same GC settings
    await quiet(env)
    before, delayed, stolen = await daemon_gc(env), await delayed_fsyncs(env), steal_ms()
    await watch_stalls(env)
    started = time.perf_counter()
    result = await section(env)
    took, stolen = time.perf_counter() - started, steal_ms() - stolen
    print(f"bench: {name}: {took:.1f} s; vCPU time the host took (steal): {stolen:.0f} ms; "
          f"the daemon's GC pauses: {gc_note(before, await daemon_gc(env))}; "
          f"{await redis_stalls(env, delayed)}", file=sys.stderr, flush=True)
    return result if isinstance(result, list) else [result]


def main(description: str | None = None) -> None:
    """Parse the command line and run."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller counts: a run of under a minute")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    parser.add_argument("--peers", action="store_true", help="also the Agents SDK and ADK (own virtualenv)")
    parser.add_argument("--markdown", type=Path, metavar="FILE",
                        help="also write the figures as a markdown table with the run's date, commit, load and "
                             "steal: into FILE between its marks (docs/benchmarks.md), or as a new FILE")
    args = parser.parse_args()
    if args.markdown:
        check_markdown_file(args.markdown)  # before minutes of measuring, not after
    if args.peers and args.only:  # the peer rows are ratios to these two
        args.only += [name for name in peers.NEEDS if name not in args.only]
    anyio.run(run, args)
