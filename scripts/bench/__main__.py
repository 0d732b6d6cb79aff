"""memento-sessions benchmark: every hot path beside the raw floor, measured in one run.

Starts the daemon's embedded default in a temporary directory (a redis-server for the sessions, a
second one with FalkorDB for the graphs, and Postgres) and a daemon process on them, then measures
each figure and the bare redis-py call of the same backend work, on the same server (the floor), side
by side, and prints a table and one JSON line.

    .venv/bin/python scripts/bench.py            # full run (a few minutes)
    .venv/bin/python scripts/bench.py --quick    # under a minute
    .venv/bin/python scripts/bench.py --peers    # also the peers, on the same Redis and Postgres
    .venv/bin/python scripts/bench.py --only emit ws-ingest   # some sections
    .venv/bin/python scripts/bench.py --markdown docs/benchmarks.md   # and its table of today's figures

With --peers, the OpenAI Agents SDK and Google ADK are installed from PyPI into their own
virtualenv (.bench-peers-venv/, made once and reused; never the project's), and
scripts/bench_peers.py runs there against this run's servers. Their rows show memento's figure as
the value and the peer's as the floor, so the ratio is memento / peer.

With --markdown FILE the run also writes its figures as a markdown table (each beside its floor, ratio,
target, met, steal and the `--only` that measures it again), headed by the run's date, commit, command,
and the host's load and steal: into the marked part of FILE, or as a new FILE.
"""

from bench.driver import main

main(__doc__)
