"""memento-sessions benchmark, as a package: a harness, one module per section, targets as data.

`scripts/bench.py` is the entry point (`.venv/bin/python scripts/bench.py --help`); it runs
`bench.driver.main`. The modules:

    harness.py     what every section uses: Env (the servers, the daemon's port, a Redis client, a
                   SessionManager wired as the daemon's), Figure, Target, the timing helpers, PAYLOAD
    watch.py       what the run prints beside each section: the host's steal, the daemon's GC pauses,
                   Redis's own stalls; and `quiet`, which waits out an AOF rewrite before timing
    receivers.py   lean WebSocket and RESP clients (many in one process without costing the servers CPU)
    cypher.py      a FalkorDB query as its client sends it (the falkordb package's own parameter encoder)
    driver.py      the servers, the daemon process, the run
    report.py      what the run leaves: the table, the JSON line, and --markdown's table for docs/benchmarks.md
    numbers.py     a figure's value to the precision a reader compares by (the table's and bench_ab.py's)
    daemons.py     daemon processes on the run's servers; their CPU seconds and RSS from /proc
    crowd.py       many lean clients in a process of their own (so their CPU is not the measured one's)
    sections.py    the registry: section name -> the coroutine that measures it
    host.py        the host's noise floor: a bare round trip between two processes, to read the others by
    emit.py, fanout.py, replay.py, memory.py, checkpoint.py, bridge.py, ingest.py, coordination.py,
    lifecycle.py, scale.py (cross-daemon CPU, connection density, deliveries per CPU-second),
    otlp.py (Claude Code's log records through /v1/logs),
    replicas.py (emits with MEMENTO_REPLICA_ACKS=1 on a primary and replica of its own)   the sections
    neighbour.py   noisy-neighbour: another namespace's emit latency while one tenant runs a heavy load
    loads.py       the tenant's loads it runs (leases, checkpoints, forks)
    victim.py      its victim, a lean client emitting on a schedule, in a process of its own
    heavy.py       heavy-rss: the daemon's RSS growth per fork, suspend and resume, at two session sizes
    tenant.py      a namespace of its own for those: its tokens and connections, heavy sessions in it
    peers.py       --peers: the OpenAI Agents SDK and Google ADK in their own virtualenv (bench_peers.py)

Adding a section is one new module and one registry line:

1. `scripts/bench/<name>.py` with `async def measure(env: Env) -> Figure | list[Figure]` (any name will
   do). Time the figure and, in the same run, its floor: bare redis-py (or asyncpg, or FalkorDB's
   GRAPH.QUERY through `cypher.query`) doing the same backend work. Give the Figure a Target, e.g.
   `Target.ratio_at_least(0.7, "bare FCALL")`, `Target.below_ms(20)` (p99 in ms), `Target.under(30, "KB")` or
   `Target.at_least(50_000, "events/s")`; the driver judges it.
2. In `sections.py`, import the module and add one line to SECTIONS: `"<name>": <module>.measure,`.
   `scripts/bench.py --only <name>` then runs it alone.

Sections import from `harness` (and `watch`, `receivers`, `cypher`, `daemons`, `tenant`, `loads`, `victim`), never
from each other or from `driver`, so there is no import cycle.
"""
