"""The registry: each section's name (what `--only` takes) and the coroutine that measures it, in run order.

Adding a section: write its module (see the package's docstring), import it here, add one line below.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bench import (
    bridge,
    checkpoint,
    coordination,
    emit,
    fanout,
    heavy,
    host,
    ingest,
    intents,
    lifecycle,
    memory,
    neighbour,
    otlp,
    replay,
    replicas,
    scale,
)
from bench.harness import Env, Figure

Section = Callable[[Env], Awaitable[Figure | list[Figure]]]

SECTIONS: dict[str, Section] = {
    "host": host.round_trip,
    "emit": emit.sequential,
    "emit-64": emit.concurrent,
    "batch": emit.batch,
    "replica-acks": replicas.measure,
    "ws-ingest": emit.ws_ingest,
    "handoff-100": fanout.handoff_100,
    "handoff-1000": fanout.handoff_1000,
    "fanout-1000": fanout.fanout_1000,
    "handoff-100-apart": fanout.handoff_apart,
    "cross-daemon": scale.cross_daemon,
    "density": scale.density,
    "deliveries": scale.deliveries,
    "replay": replay.measure,
    "memory": memory.measure,
    "checkpoint": checkpoint.measure,
    "bridge": bridge.measure,
    "ingest": ingest.ingest,
    "hook": ingest.hook,
    "otlp": otlp.otlp_logs,
    "lease-acquire": coordination.lease_acquire,
    "intent": intents.measure,
    "mailbox": coordination.mailbox_live,
    "emit-leases": coordination.emit_with_leases,
    "time-travel": lifecycle.time_travel,
    "lifecycle": lifecycle.moves,
    "noisy-neighbour": neighbour.noisy_neighbour,
    "heavy-rss": heavy.heavy_rss,
}
