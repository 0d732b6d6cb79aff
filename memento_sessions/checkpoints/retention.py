"""Retention: old anchors and orphan stub entities pruned, old snapshot partitions dropped; hourly, by the
daemon holding a lease.

The lease is a Redis key set with NX and PX and renewed by its holder; if the holder dies, the key
expires and another daemon takes over within one lease time.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

import anyio
import redis.asyncio as aioredis
from anyio.abc import TaskStatus

from memento_sessions import keys
from memento_sessions.backends import UNANSWERED, UNAVAILABLE
from memento_sessions.checkpoints.anchors import prune_graph
from memento_sessions.checkpoints.snapshots import Snapshots
from memento_sessions.kg.graph import Graphs
from memento_sessions.logs import get_logger, one_pass
from memento_sessions.settings import Settings

log = get_logger(__name__)

RETENTION_INTERVAL = 3600.0
LEASE_SECONDS = 60.0

RENEW_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
RELEASE_ERRORS: tuple[type[BaseException], ...] = (*UNAVAILABLE, TimeoutError)
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass
class PruneReport:
    """What one retention run removed."""

    anchors: dict[str, int] = field(default_factory=dict)
    stubs: dict[str, int] = field(default_factory=dict)
    partitions: list[str] = field(default_factory=list)

    @property
    def anchors_removed(self) -> int:
        return sum(self.anchors.values())

    @property
    def stubs_removed(self) -> int:
        return sum(self.stubs.values())


async def prune(graphs: Graphs, snapshots: Snapshots, namespaces: Iterable[str] | None,
                settings: Settings) -> PruneReport:
    """Run both retention jobs once; `namespaces` None means every namespace that has a graph."""
    report = PruneReport()
    for namespace in namespaces if namespaces is not None else await graphs.namespaces():
        graph = await graphs.get(namespace)
        pruned = await prune_graph(graph, timedelta(days=settings.anchor_max_age_days))
        report.anchors[namespace], report.stubs[namespace] = pruned
    if snapshots.postgres.enabled:
        report.partitions = await snapshots.drop_old_partitions(settings.snapshot_max_age_days)
    return report


def lease_owner() -> str:
    """A name unique to this daemon process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """A Redis lease: `held` is True while this process owns `key`."""

    def __init__(self, redis: aioredis.Redis, key: str | None = None, owner: str | None = None,
                 seconds: float = LEASE_SECONDS) -> None:
        self.redis = redis
        self.key = key or keys.retention_lease()
        self.owner = owner or lease_owner()
        self.seconds = seconds
        self.held = False

    @property
    def _ms(self) -> int:
        return int(self.seconds * 1000)

    async def try_hold(self) -> bool:
        """Take the lease if it is free, renew it if it is ours; False when another daemon has it."""
        if await self.redis.set(self.key, self.owner, nx=True, px=self._ms):
            return True
        return bool(await self.redis.eval(RENEW_LEASE, 1, self.key, self.owner, self._ms))

    async def release(self) -> None:
        """Give the lease up if it is ours; safe to call twice."""
        self.held = False
        await self.redis.eval(RELEASE_LEASE, 1, self.key, self.owner)

    async def keep(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold or wait for the lease forever, checking three times per lease time; release on exit."""
        try:
            self.held = await self._check()
            task_status.started()
            while True:
                await anyio.sleep(self.seconds / 3)
                self.held = await self._check()
        finally:
            with anyio.CancelScope(shield=True):
                await self._release_quietly()

    async def _release_quietly(self) -> None:
        """On the way out a down Redis must not turn a clean stop into an error: the lease expires anyway."""
        try:
            with anyio.fail_after(2.0):
                await self.release()
        except RELEASE_ERRORS as exc:
            log.warning("retention lease not released; it will expire", error=repr(exc))

    async def _check(self) -> bool:
        try:
            return await self.try_hold()
        except UNAVAILABLE as exc:
            log.warning("retention lease check failed", error=repr(exc))
            return False


async def run_while_leader(lease: Lease, job: Callable[[], Awaitable[object]], interval: float = RETENTION_INTERVAL,
                           *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Run `job` every `interval` seconds, only while `lease` is held by this process."""
    async with anyio.create_task_group() as tg:
        await tg.start(lease.keep)
        task_status.started()
        next_run = 0.0
        while True:
            if lease.held and anyio.current_time() >= next_run:
                await _run_logged(job)
                next_run = anyio.current_time() + interval
            await anyio.sleep(min(interval, lease.seconds / 3))


async def _run_logged(job: Callable[[], Awaitable[object]]) -> None:
    """A failed run is logged and retried at the next interval, never fatal to the daemon."""
    result = await one_pass(job, "retention run", UNANSWERED)
    if result is not None:
        log.info("retention run", result=repr(result))


def retention_job(graphs: Graphs, snapshots: Snapshots, settings: Settings) -> Callable[[], Awaitable[PruneReport]]:
    """The daemon's job: prune every namespace."""

    async def job() -> PruneReport:
        return await prune(graphs, snapshots, None, settings)

    return job
