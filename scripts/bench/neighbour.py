"""Noisy neighbour: one namespace's event.emit latency while a tenant of another namespace runs a heavy
load (loads.py: leases, checkpoints, forks), against the same emits with no load, in the same run.

The victim is a lean client (receivers.LeanCaller, one request frame built once) in a process of its own
(victim.py: the load's client work, such as sending a 700 KB batch, is then not the victim's), emitting
into its own session one event at a time on a fixed schedule (PACE a second), over a window that ends after 1,000
emits (300 with --quick), when the load has spent its steps, or at the deadline (three times the
window's planned length), whichever comes first. A load's figure is the victim's p99 under it beside
its p99 with no load (the ratio must stay within 3x): the lower of the section's first window and of one
right before the load's, as the host's other work changes within a minute. The first no-load window's
figure stands beside the floor: the bare FCALL of the same emit (the Function the daemon calls),
sequential, in the same run.

Each emit's latency counts from when it was due on the schedule to its reply, so a long stall counts once
for every emit it held back (the victim catches up after it with no pause), as an agent emitting at that
rate lives it; counted from each send instead (`per_call_*` in the extras), a 1.4 s stall in a window of
300 emits is one sample, and the p99 does not see it. A victim that cannot keep up at all (a stall on
every request) falls behind by up to the whole window: its p99 is then the window's length.

Beside every window a bare PING goes to the sessions' Redis every 10 ms (`redis_ping_*` in the extras): a
victim tail that comes with the PING's was Redis's (a long Function holding its one thread; the graphs'
queries run in a redis-server of their own); one that comes alone was the daemon's (its event loop busy
with the tenant's request). `redis_aof_rewrites` counts the AOF rewrites of that Redis that ended in the
window: each end stalls it for as long as its disk takes to sync a file (13-16 ms here), and a tenant's
writes bring one per MEMENTO_REDIS_AOF_REWRITE_SIZE (1 GiB) of AOF, so a 5 s window mostly has none.
"""

from __future__ import annotations

import math
import sys

import anyio

from bench.harness import (
    Env,
    Figure,
    Samples,
    Target,
    floor_args,
    new_session,
    pct,
    timed,
)
from bench.loads import Checkpoints, Forks, Leases, Load, LoadRun, drive
from bench.tenant import Tenant, tenant_ws
from bench.victim import Victim, Window, apart, q
from bench.watch import quiet

PACE = 200  # victim emits a second
PING_EVERY = 0.01  # seconds between the bare PINGs beside a window
CALL_TIMEOUT = 60.0  # seconds: a victim's emit still unanswered then fails the window
WITHIN = Target(3.0, on_ratio=True, below=True, text="<= 3 x the victim's p99 with no load")


def loads(env: Env) -> list[Load]:
    """The three loads, each by a tenant of its own, sized for the run."""
    quick = env.quick
    return [Leases(Tenant.new("leases"), 16 if quick else 50, 100_000, 10.0 if quick else 40.0),
            Checkpoints(Tenant.new("checkpoints"), 20 if quick else 100),
            Forks(Tenant.new("forks"), 10 if quick else 50, 15 if quick else 30)]


async def noisy_neighbour(env: Env) -> list[Figure]:
    """The victim's emit p99 with no load, then under each load in turn."""
    count = 300 if env.quick else 1000
    victim = Tenant.new("victim")
    async with apart(env.port, victim.token("victim"), env.redis_url, count, PACE, PING_EVERY,
                     CALL_TIMEOUT) as caller:
        floor = await bare_emits(env, count)
        await quiet(env)
        calm = await watched(env, caller, None)
        figures = [Figure("noisy-neighbour: other namespace's emit p99, no load", "ms",
                          pct(calm.late, 0.99), pct(floor, 0.99), higher_is_better=False,
                          extra=calm.extra() | {"floor_p50_ms": pct(floor, 0.5)})]
        for load in loads(env):
            figures.append(await loaded(env, caller, load, calm))
    return figures


async def loaded(env: Env, caller: Victim, load: Load, first: Window) -> Figure:
    """The victim's figure under one load, beside the lower no-load p99 of the section's first window and of
    one just before the load's (a reference the host's noise raised would make the target easier); NaN,
    said on stderr, when the load could not run (a daemon that refuses its set-up, say): the run's other
    figures still print."""
    name = f"noisy-neighbour: other namespace's emit p99, {load.name} load"
    try:
        calm, seen, run = await under(env, caller, load)
    except Exception as exc:  # any failure of one load is reported, not fatal to the run
        print(f"bench: noisy-neighbour: the {load.name} load failed: {exc!r}", file=sys.stderr, flush=True)
        return Figure(name, "ms", math.nan, None, WITHIN, higher_is_better=False, extra={"failed": 1})
    reference = min(q(first.late, 0.99), q(calm.late, 0.99))
    return Figure(name, "ms", q(seen.late, 0.99), reference, WITHIN, higher_is_better=False,
                  extra=seen.extra() | {"no_load_before_p99_ms": q(calm.late, 0.99)} | steps(run) | load.note())


async def bare_emits(env: Env, count: int) -> Samples:
    """The floor: FCALL ms_emit of an event as the daemon sends it, sequential, with no load."""
    fkeys, fargs = floor_args(env, await new_session(env, env.manager()))
    return await timed(count, lambda _: env.redis.fcall("ms_emit", 4, *fkeys, *fargs), remote=True)


async def under(env: Env, caller: Victim, load: Load) -> tuple[Window, Window, LoadRun]:
    """The load made ready; a window of the victim's emits with no load, then one while the load runs."""
    try:
        async with tenant_ws(env, load.tenant, "tenant") as rpc:
            await load.setup(env, rpc)
            await quiet(env)
            calm = await watched(env, caller, None)
            await quiet(env)
            stop, run = anyio.Event(), LoadRun()
            async with anyio.create_task_group() as tg:
                tg.start_soon(drive, load, rpc, stop, run)
                seen = await watched(env, caller, run.finished)
                stop.set()
    finally:
        await load.cleanup(env)
    return calm, seen, run


async def watched(env: Env, caller: Victim, ended: anyio.Event | None) -> Window:
    """A window of the victim's, with the AOF rewrites of the sessions' Redis that ended in it: the end of
    each holds Redis's one thread while it syncs the AOF's manifest (docs/security.md)."""
    before = await aof_rewrites(env)
    window = await caller.window(ended)
    window.aof_rewrites = await aof_rewrites(env) - before
    return window


async def aof_rewrites(env: Env) -> int:
    return int((await env.redis.info("persistence"))["aof_rewrites"])


def steps(run: LoadRun) -> dict[str, float]:
    """What the load did in the window."""
    ops = run.ops or [0.0]
    return {"load_steps": len(run.ops), "load_errors": run.errors, "load_step_p50_ms": pct(ops, 0.5),
            "load_step_max_ms": max(ops)}
