"""What the run prints beside each section, so a slow figure can be told from a busy host.

The host's steal (vCPU time the hypervisor gave to something else), the daemon's collector pauses, and
each redis-server's own stalls (its latency monitor, AOF writes held back by a slow fsync): the sessions'
Redis and the graphs' FalkorDB. `quiet` waits out an AOF rewrite of either before a timed part starts.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import Env

STALL_MS = 5
GcPauses = dict[str, tuple[float, float, float]]


async def quiet(env: Env) -> None:
    """Wait (up to 60 s) until neither redis-server is rewriting its AOF or saving an RDB.

    Redis rewrites the AOF each time it doubles past 64 MB (about every 100,000 events here: ~520 bytes
    of AOF per event; FalkorDB's after a graph load), in a forked child that keeps one of the two vCPUs
    busy for a second or more. A figure timed beside one measures that contention, so each timed part
    starts on quiet servers; the waits are printed.
    """
    for name, client in env.servers.items():
        started, polls = time.perf_counter(), 0
        with anyio.fail_after(60):
            while True:
                stats = await client.info("persistence")
                if not stats.get("aof_rewrite_in_progress") and not stats.get("rdb_bgsave_in_progress"):
                    break
                polls += 1
                await anyio.sleep(0.05)
        if polls:
            waited = time.perf_counter() - started
            print(f"bench: waited {waited:.2f} s for {name}'s AOF rewrite to finish", file=sys.stderr, flush=True)


async def metrics_text(port: int) -> str:
    """The daemon's /metrics page."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        await stream.send(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        raw = b""
        with anyio.move_on_after(5):
            while True:
                try:
                    raw += await stream.receive()
                except anyio.EndOfStream:
                    break
    return raw.partition(b"\r\n\r\n")[2].decode()


async def daemon_gc(env: Env) -> GcPauses:
    """The daemon's collector pauses so far, from its /metrics: per generation (count, total s, count > 5 ms)."""
    pauses: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(await metrics_text(env.port)):
        if family.name != "memento_gc_pause_seconds":
            continue
        for sample in family.samples:
            found = pauses.setdefault(sample.labels["generation"], [0.0, 0.0, 0.0, 0.0])
            if sample.name.endswith("_count"):
                found[0] = sample.value
            elif sample.name.endswith("_sum"):
                found[1] = sample.value
            elif sample.labels.get("le") == "0.005":
                found[3] = sample.value
    return {gen: (count, total, count - within) for gen, (count, total, _, within) in pauses.items()}


def gc_note(before: GcPauses, after: GcPauses) -> str:
    """`gen0 12 (3.1 ms), gen2 1 (41.0 ms, 1 over 5 ms)`: the daemon's pauses between two readings."""
    parts = []
    for gen in sorted(after):
        count, total, slow = (a - b for a, b in zip(after[gen], before.get(gen, (0.0, 0.0, 0.0)), strict=True))
        if count:
            parts.append(f"gen{gen} {count:.0f} ({total * 1000:.1f} ms" + (f", {slow:.0f} over 5 ms)" if slow else ")"))
    return ", ".join(parts) or "none"


async def watch_stalls(env: Env) -> None:
    """Each redis-server's latency monitor on (events over STALL_MS), its record so far cleared."""
    for client in env.servers.values():
        await client.config_set("latency-monitor-threshold", STALL_MS)
        await client.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]


async def delayed_fsyncs(env: Env) -> dict[str, int]:
    """Times each redis-server held back an AOF write because the background fsync of the last one was
    still running."""
    return {name: int((await client.info("persistence"))["aof_delayed_fsync"]) for name, client in env.servers.items()}


async def redis_stalls(env: Env, delayed_before: dict[str, int]) -> str:
    """What each redis-server's latency monitor saw since the last LATENCY RESET (events over STALL_MS), and
    its AOF writes held back since `delayed_before`, in words.

    A slow disk shows as `aof-write-pending-fsync` or `aof-fsync-always`: the main thread waited on the AOF,
    and every reply and publish waited with it. Each event's history holds one sample per second at most.
    """
    delayed, notes = await delayed_fsyncs(env), []
    for name, client in env.servers.items():
        parts = []
        for event, _, _, worst in await client.execute_command("LATENCY", "LATEST"):  # type: ignore[no-untyped-call]
            history = await client.execute_command("LATENCY", "HISTORY", event)  # type: ignore[no-untyped-call]
            parts.append(f"{event} in {len(history)} s (max {worst} ms)")
        notes.append(f"{name} stalls over {STALL_MS} ms: {', '.join(parts) or 'none'}; AOF writes held back by a "
                     f"slow fsync: {delayed[name] - delayed_before.get(name, 0)}")
    return "; ".join(notes)


def steal_ms() -> float:
    """Milliseconds the hypervisor has run something else on this VM's vCPUs, summed over vCPUs (0 off Linux).

    A tail latency that comes with steal was the host's, not the code's.
    """
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0
    return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0
