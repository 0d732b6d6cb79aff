#!/usr/bin/env python3
"""Chaos run: two daemons on one Redis, an agent emitting with retries, subscribers on both daemons,
while pub/sub connections are killed, Redis is restarted (SIGTERM and SIGKILL), a daemon is SIGKILLed
and restarted, and subscribers are cut. At the end every stored event is read back from Redis.

It prints the events acked, stored, lost (acked but not stored), doubled (one id stored twice), gaps
(seqs missing between 1 and the last), and for each subscriber the seqs missing, doubled, out of order
and mismatched (the id it was handed at a seq is not the one stored there), then one JSON line.
The target is 0 of each; the exit code is 0 when it is met, 1 when not.

With --cluster the run is on a Redis Cluster of 3 primaries with a replica each (chaos_cluster.py): the
primary of the session's slot is SIGKILLed and its replica promoted, and the session's slot is migrated,
instead of Redis being restarted; --replica-acks sets the daemons' MEMENTO_REPLICA_ACKS.

Everything runs on loopback under a temporary directory and stops by itself (--max-seconds).
Redis runs with `appendfsync always` by default, so an acknowledged event is on disk before its reply.
With `--fsync everysec` (the embedded default) Redis still write()s the AOF before it replies, so killing
the Redis process loses nothing the kernel has; what everysec risks is the last ~1 s on a crash of the
machine, and acknowledged writes Redis holds back while a slow fsync runs (up to 2 s). A run counts
any loss as lost rather than hides it.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_cluster import ChaosCluster
from chaos_procs import ChaosRedis, DaemonProc, start_backends
from chaos_roles import Agent, Watcher

from memento_sessions.auth import issue_token
from memento_sessions.client import Client
from memento_sessions.keys import session_keys
from memento_sessions.logs import configure_logging

NAMESPACE = "chaos"
ACTIONS = ["pubsub_kill", "cut_subscribers", "redis_sigterm", "daemon_sigkill", "pubsub_kill", "cut_subscribers",
           "redis_sigkill", "daemon_sigkill"]
CLUSTER_ACTIONS = ["pubsub_kill", "cut_subscribers", "primary_sigkill", "daemon_sigkill", "slot_migrate",
                   "cut_subscribers", "primary_sigkill", "daemon_sigkill"]
Backend = ChaosRedis | ChaosCluster


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's options (see --help)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--events", type=int, default=100_000, help="events the agent emits (default 100000)")
    add("--batch", type=int, default=10, help="events per event.emitBatch call (default 10)")
    add("--inflight", type=int, default=4, help="batches in flight at once (default 4)")
    add("--rate", type=float, default=400.0, help="at most this many events a second (default 400)")
    add("--subscribers", type=int, default=2, help="subscribers on each daemon (default 2)")
    add("--interval", type=float, default=5.0, help="seconds between chaos actions (default 5)")
    add("--actions", default="all",
        help=f"chaos actions to rotate through, comma-separated (default all: {', '.join(dict.fromkeys(ACTIONS))}; "
             f"with --cluster {', '.join(dict.fromkeys(CLUSTER_ACTIONS))})")
    add("--cluster", action="store_true", help="on a Redis Cluster of 3 primaries with a replica each")
    add("--replica-acks", type=int, default=0, help="the daemons' MEMENTO_REPLICA_ACKS (default 0)")
    add("--fsync", choices=["always", "everysec"], default="always", help="Redis appendfsync (default always)")
    add("--timeout", type=float, default=5.0, help="seconds the agent waits for one reply before retrying")
    add("--settle", type=float, default=60.0, help="seconds subscribers get to catch up after the agent")
    add("--max-seconds", type=float, default=600.0, help="the whole run stops after this (default 600)")
    add("--checkpoint-every", type=int, default=1000, help="MEMENTO_CHECKPOINT_EVERY of the daemons")
    add("--seed", type=int, default=1, help="seeds the order of chaos targets (default 1)")
    add("--workdir", type=Path, default=None, help="keep servers' data and logs here (default: a temp dir)")
    return parser.parse_args(argv)


class Chaos:
    """The servers, the daemons, and the actions done to them."""

    def __init__(self, opts: argparse.Namespace, redis: Backend, daemons: list[DaemonProc],
                 watchers: list[Watcher], session_id: str) -> None:
        self.opts, self.redis, self.daemons, self.watchers = opts, redis, daemons, watchers
        self.session_key = session_keys(NAMESPACE, session_id).session
        self.rng = random.Random(opts.seed)
        self.done: list[str] = []
        self.started = time.monotonic()
        self.progress: Any = lambda: ""  # a line on the agent's progress, added to each action's line

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", flush=True)

    async def run(self, stop: anyio.Event) -> None:
        """One action every `interval` seconds, in rotation, until `stop`."""
        rotation = CLUSTER_ACTIONS if isinstance(self.redis, ChaosCluster) else ACTIONS
        actions = [a for a in rotation if self.opts.actions == "all" or a in self.opts.actions.split(",")]
        for turn in range(10**9):
            with anyio.move_on_after(self.opts.interval):
                await stop.wait()
            if stop.is_set() or not actions:
                return
            action = actions[turn % len(actions)]
            took = time.monotonic()
            detail = await getattr(self, action)()
            self.done.append(action)
            self.say(f"{action}: {detail} ({time.monotonic() - took:.1f}s); {self.progress()}")

    async def pubsub_kill(self) -> str:
        killed = await anyio.to_thread.run_sync(self.redis.kill_pubsub)
        return f"{killed} pub/sub connection(s) killed"

    async def primary_sigkill(self) -> str:
        assert isinstance(self.redis, ChaosCluster)
        return await anyio.to_thread.run_sync(self.redis.primary_sigkill, self.session_key)

    async def slot_migrate(self) -> str:
        assert isinstance(self.redis, ChaosCluster)
        return await anyio.to_thread.run_sync(self.redis.migrate, self.session_key)

    async def cut_subscribers(self) -> str:
        chosen = self.rng.sample(self.watchers, max(1, len(self.watchers) // 2))
        return f"cut {sum(w.cut() for w in chosen)} of {len(chosen)}"

    async def redis_sigterm(self) -> str:
        return await self._restart_redis(signal.SIGTERM)

    async def redis_sigkill(self) -> str:
        return await self._restart_redis(signal.SIGKILL)

    async def _restart_redis(self, sig: int) -> str:
        assert isinstance(self.redis, ChaosRedis)
        await anyio.to_thread.run_sync(self.redis.kill, sig)
        down = time.monotonic()
        # Started from this (the main) thread, not a worker: the child's parent-death signal fires when the
        # thread that started it exits, and anyio ends worker threads that sit idle.
        self.redis.start()
        return f"Redis {signal.Signals(sig).name}, back on port {self.redis.port} in {time.monotonic() - down:.1f}s"

    async def daemon_sigkill(self) -> str:
        daemon = self.daemons[self.done.count("daemon_sigkill") % len(self.daemons)]  # each in turn
        daemon.kill()
        await anyio.sleep(0.3)
        daemon.start()
        daemon.restarts += 1
        ready = await anyio.to_thread.run_sync(daemon.wait_ready, 60.0)
        return f"{daemon.name} SIGKILLed, ready again in {ready:.1f}s"


def stored(server: Backend, session_id: str) -> list[tuple[int, str | None]]:
    """(seq, id) of every stored event of the session, in seq order."""
    key = session_keys(NAMESPACE, session_id).events
    client = server.client_for(key)
    found: list[tuple[int, str | None]] = []
    total: int = client.zcard(key)
    for start in range(0, total, 10_000):
        page: list[tuple[str, float]] = client.zrange(key, start, start + 9_999, withscores=True)  # type: ignore[assignment]
        found += [(int(score), json.loads(member).get("id")) for member, score in page]
    return found


def figures(agent: Agent, events: list[tuple[int, str | None]]) -> dict[str, Any]:
    """acked, stored, lost, doubled, gaps, and the details behind them."""
    by_id: dict[str | None, list[int]] = {}
    for seq, event_id in events:
        by_id.setdefault(event_id, []).append(seq)
    seqs = {seq for seq, _ in events}
    last = max(seqs, default=0)
    lost = [i for i in agent.acked if i not in by_id]
    moved = [i for i, seq in agent.acked.items() if i in by_id and seq not in by_id[i]]
    return {"acked": len(agent.acked), "stored": len(events), "lost": len(lost),
            "doubled": sum(len(s) - 1 for i, s in by_id.items() if i is not None),
            "gaps": last - len(seqs), "seq_reused": len(events) - len(seqs), "acked_seq_moved": len(moved),
            "seq_changed_on_retry": agent.seq_changed, "last_seq": last, "lost_ids": sorted(lost)[:20]}


def watcher_figures(watcher: Watcher, events: list[tuple[int, str | None]]) -> dict[str, Any]:
    """What one subscriber missed, got twice, got out of order, or got wrong."""
    id_at = dict(events)
    got = set(watcher.seqs)
    out_of_order = sum(1 for a, b in zip(watcher.seqs, watcher.seqs[1:], strict=False) if b <= a)
    mismatched = sum(1 for seq, event_id in zip(watcher.seqs, watcher.ids, strict=True)
                     if seq in id_at and id_at[seq] != event_id)
    return {"name": watcher.name, "received": len(watcher.seqs), "missing": len(set(id_at) - got),
            "doubled": len(watcher.seqs) - len(got), "out_of_order": out_of_order, "mismatched": mismatched,
            "history_lost": watcher.history_lost, "reconnects": watcher.reconnects(), "restarts": watcher.restarts,
            "restart_reasons": dict(watcher.restart_reasons)}


def target_met(result: dict[str, Any]) -> bool:
    """0 lost, 0 doubled, 0 gaps, every event acked, and every subscriber whole."""
    store = result["store"]
    whole = all(w["missing"] == w["doubled"] == w["out_of_order"] == w["mismatched"] == 0
                for w in result["subscribers"])
    return bool(store["lost"] == store["doubled"] == store["gaps"] == store["seq_reused"] == 0
                and store["acked"] == result["options"]["events"] and whole)


def print_report(result: dict[str, Any]) -> None:
    store = result["store"]
    print(f"\nevents: acked {store['acked']}, stored {store['stored']}, lost {store['lost']}, "
          f"doubled {store['doubled']}, gaps {store['gaps']} (last seq {store['last_seq']}; seqs reused "
          f"{store['seq_reused']}; acked seq moved {store['acked_seq_moved']})")
    print(f"agent: {result['agent']['retries']} retries {result['agent']['errors']}")
    for w in result["subscribers"]:
        print(f"subscriber {w['name']}: received {w['received']}, missing {w['missing']}, doubled {w['doubled']}, "
              f"out of order {w['out_of_order']}, mismatched {w['mismatched']}, history lost {w['history_lost']}, "
              f"reconnects {w['reconnects']}, restarts {w['restarts']} {w['restart_reasons'] or ''}")
    print(f"chaos: {result['chaos']}; Redis appendfsync {result['appendfsync']}; daemon log errors "
          f"{result['daemon_log_errors']}")
    print("target (0 lost, 0 doubled, 0 gaps, subscribers whole):", "MET" if result["target_met"] else "MISSED")
    print(json.dumps(result, sort_keys=True), flush=True)


async def settle(watchers: list[Watcher], last_seq: int, timeout: float) -> None:
    """Wait until every subscriber has reached `last_seq` (or `timeout`)."""
    with anyio.move_on_after(timeout):
        while any(w.last_seq < last_seq for w in watchers):
            await anyio.sleep(0.1)


async def drive(opts: argparse.Namespace, redis: Backend, daemons: list[DaemonProc], token: str) -> dict[str, Any]:
    """Create the session, run agent, subscribers and chaos, and measure."""
    deadline = time.monotonic() + opts.max_seconds - opts.settle - 15
    async with Client(daemons[0].url, token) as client:
        session_id = (await client.create_session(labels={"run": "chaos"}))["sessionId"]
    watchers = [Watcher(f"{d.name}-{i}", d.url, token, session_id) for d in daemons for i in range(opts.subscribers)]
    agent = Agent([d.url for d in daemons], token, session_id, opts)
    chaos, stop = Chaos(opts, redis, daemons, watchers, session_id), anyio.Event()
    chaos.progress = lambda: f"{len(agent.acked)} acked, subscribers at {[w.last_seq for w in watchers]}"
    async with anyio.create_task_group() as tg:
        for watcher in watchers:
            tg.start_soon(watcher.run)
        tg.start_soon(chaos.run, stop)
        await anyio.sleep(0.5)  # subscribers are in place before the first event
        await agent.run(deadline)
        stop.set()
        chaos.say(f"agent done: {len(agent.acked)} acked; letting subscribers settle")
        events = await anyio.to_thread.run_sync(stored, redis, session_id)
        await settle(watchers, max((s for s, _ in events), default=0), opts.settle)
        tg.cancel_scope.cancel()
    events = await anyio.to_thread.run_sync(stored, redis, session_id)
    return {"store": figures(agent, events), "subscribers": [watcher_figures(w, events) for w in watchers],
            "agent": {"retries": agent.retries, "errors": dict(agent.errors)}, "chaos": dict_count(chaos.done)}


def dict_count(items: list[str]) -> dict[str, int]:
    return {item: items.count(item) for item in dict.fromkeys(items)}


def start_daemons(workdir: Path, redis: Backend, postgres_dsn: str, secret: str, opts: Any) -> list[DaemonProc]:
    env = {**redis.env(), "MEMENTO_REPLICA_ACKS": str(opts.replica_acks),
           "MEMENTO_REDIS_URL": redis.tcp_url, "MEMENTO_POSTGRES_DSN": postgres_dsn, "MEMENTO_AUTH_SECRET": secret,
           "MEMENTO_CHECKPOINT_EVERY": str(opts.checkpoint_every),
           "MEMENTO_SESSION_MAX_EVENTS": str(max(opts.events + 1_000, 100_000))}
    daemons = [DaemonProc(name, workdir, env) for name in ("daemon-a", "daemon-b")]
    for daemon in daemons:
        daemon.start()
    for daemon in daemons:
        daemon.wait_ready(60)
    return daemons


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    configure_logging("console", "warning")  # the client's reconnect notes would drown the report
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="memento-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    redis, postgres = start_backends(workdir, opts.fsync, opts.cluster)
    daemons: list[DaemonProc] = []
    try:
        secret = secrets.token_urlsafe(48)
        daemons = start_daemons(workdir, redis, postgres.url, secret, opts)
        token = issue_token(secret, "chaos-agent", NAMESPACE, "sessions:read sessions:write", 6 * 3600)
        where = "a Redis Cluster" if opts.cluster else f"Redis on 127.0.0.1:{redis.port}"  # type: ignore[union-attr]
        print(f"{where} (appendfsync {redis.applied_fsync()}), daemons on "
              f"{', '.join(str(d.port) for d in daemons)}; logs in {workdir}", flush=True)
        result = anyio.run(drive, opts, redis, daemons, token)
        result.update(options={**vars(opts), "workdir": str(workdir)}, appendfsync=redis.applied_fsync(),
                      daemon_log_errors={d.name: len(d.logged_errors()) for d in daemons})
        result["target_met"] = target_met(result)
        print_report(result)
        return 0 if result["target_met"] else 1
    finally:
        for daemon in daemons:
            daemon.stop()
        redis.stop()
        postgres.stop()
        if opts.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
