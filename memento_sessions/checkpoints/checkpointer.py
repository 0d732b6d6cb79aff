"""The Checkpointer: aggregates each window of a session into KG anchors and failure snapshots.

Triggers: every MEMENTO_CHECKPOINT_EVERY events and every `checkpoint` event
(queued, done in the background), `session.checkpoint` and completion (done at once). A checkpoint's
id is derived from its namespace, the session's epoch, the session and its last seq, so two daemons
that checkpoint the same window write the same anchor and the same snapshot row, and a session
re-created under its id never reuses an old one; a Redis lock per session keeps them from doing the
work twice. A broken checkpoint's snapshot holds only the events after the previous snapshot of the
epoch; it is written to Redis before its anchor names it and stays there until Postgres took it
(checkpoints/pending.py), so neither an outage nor a restart loses it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from typing import Any

import anyio
import anyio.lowlevel
import pydantic_core
from anyio.abc import TaskGroup

from memento_sessions import keys
from memento_sessions.backends import UNAVAILABLE, Backends
from memento_sessions.checkpoints.aggregate import Summary, Tally
from memento_sessions.checkpoints.anchors import write_anchor
from memento_sessions.checkpoints.pending import Pending, PendingSnapshots
from memento_sessions.checkpoints.snapshots import TRANSIENT, Snapshots
from memento_sessions.checkpoints.triggers import Triggers
from memento_sessions.errors import BackendUnavailable, NotFound
from memento_sessions.kg.graph import Graphs
from memento_sessions.limits import Pacer, let_go
from memento_sessions.logs import get_logger, one_pass
from memento_sessions.metrics import (
    CHECKPOINT_ENTITIES_SKIPPED,
    CHECKPOINTS,
    KG_ANCHORS_WRITTEN,
    PACED_SECONDS,
    SNAPSHOTS_DEFERRED,
)
from memento_sessions.retry import retry
from memento_sessions.rpc import encode_notification
from memento_sessions.sessions.manager import SessionManager, now_ms
from memento_sessions.sessions.paging import per_read, redis_events, seq_of
from memento_sessions.settings import Settings

log = get_logger(__name__)
WORKERS = 4
LOCK_TTL = 30.0
DRAIN_SECONDS = 5.0
SNAPSHOT_TRANSIENT: tuple[type[BaseException], ...] = (*TRANSIENT, TimeoutError)
FLUSH_EVERY = 5.0  # seconds between passes over the pending snapshots
FLUSH_MAX_DELAY = 10.0  # the longest pause while Postgres is down
DECODE_PART = 4  # events of a window (each naming at most 256 ids) decoded and summarised per turn of the event loop


def checkpoint_id(namespace: str, epoch: str, session_id: str, seq: int, final: bool) -> str:
    """Deterministic per window: the same window gives the same id on every daemon.

    `/` occurs in no namespace, epoch or session id, so no two windows anywhere share an id.
    """
    return f"cp/{namespace}/{epoch}/{session_id}/{seq}{'/final' if final else ''}"


def decode(member: str) -> dict[str, Any]:
    """A stored event, its keys cached and not its values: a window's entity ids are seldom repeated, and
    caching every string made decoding 300 events of 256 new ids 3.5 times slower (12.5 ms, not 3.5)."""
    event: dict[str, Any] = pydantic_core.from_json(member, cache_strings="keys")
    return event


def snapshot_from(last: dict[str, Any]) -> int:
    """The seq up to which earlier snapshots of the session's epoch hold its events."""
    if "snapshotSeq" in last:
        return int(last["snapshotSeq"])
    # A checkpoint recorded before snapshots were split stored every event when it was broken.
    return int(last.get("seq", 0)) if last.get("outcome") == "broken" else 0


@contextmanager
def unwrap_group() -> Iterator[None]:
    """Let a single failure of a task group surface as itself (a JSON-RPC error), not as a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
            raise group.exceptions[0] from None
        raise


def snapshot_ref(cp_id: str) -> str:
    """An anchor's externalRef: the failure snapshot row with this checkpoint_id."""
    return f"session_snapshots/checkpoint_id={cp_id}"


class Checkpointer:
    """Runs checkpoints for every namespace; `request` queues one, `checkpoint` runs one now.

    `graphs` and `snapshots` are the daemon's one instance of each (server/services.py), shared with the
    bridge and the retention job, so a graph is indexed and the schema migrated once per daemon.
    """

    def __init__(self, settings: Settings, backends: Backends, manager: SessionManager, graphs: Graphs,
                 snapshots: Snapshots, triggers: Triggers | None = None) -> None:
        """`triggers`: the queue the manager fills on emits (passed to it as `on_emitted`); without it, only
        `session.checkpoint` runs checkpoints."""
        self.settings, self.backends, self.manager = settings, backends, manager
        self.graphs, self.snapshots = graphs, snapshots
        self.pending = PendingSnapshots(backends.redis, settings.snapshot_max_age_days * 86_400)
        self.triggers = triggers or Triggers(settings.checkpoint_every)
        self._tg: TaskGroup | None = None
        self.in_flight = 0
        self.pacer = Pacer(settings.batch_ids_pace, PACED_SECONDS.labels("checkpoint"))

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Work through queued checkpoints with a few workers, forever; the queue is closed when they stop."""
        with self.triggers.send, self.triggers.receive:
            await self._run(task_status)

    async def _run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for _ in range(WORKERS):
                tg.start_soon(self._worker)
            if self.backends.postgres.enabled:
                await self._migrate_at_start()
                tg.start_soon(self._flush_forever)
            task_status.started()

    async def _migrate_at_start(self) -> None:
        """Create or migrate the snapshot schema now; if Postgres is down, keep trying in the background."""
        try:
            with anyio.fail_after(5.0):
                await self.snapshots.migrate()
        except SNAPSHOT_TRANSIENT as exc:
            log.warning("snapshot schema not migrated yet; retrying in the background", error=repr(exc))
            assert self._tg is not None
            self._tg.start_soon(self._migrate_until_done)

    async def _migrate_until_done(self) -> None:
        """Migrate after 0.5 s, retried after 1, 2, 4 ... 30 s until Postgres takes it."""
        await anyio.sleep(0.5)
        await retry(self.snapshots.migrate, SNAPSHOT_TRANSIENT, first=1.0, cap=30.0, jitter=False)

    async def _flush_forever(self) -> None:
        """Store the snapshots left in Redis (by this daemon or one that stopped), now and every FLUSH_EVERY;
        after a failed pass the pause doubles, up to FLUSH_MAX_DELAY."""
        delay = FLUSH_EVERY
        while True:
            stored = await one_pass(partial(self.pending.flush, self.snapshots), "pending snapshot flush",
                                    (*SNAPSHOT_TRANSIENT, *UNAVAILABLE))
            delay = FLUSH_EVERY if stored is not None else min(delay * 2, FLUSH_MAX_DELAY)
            await anyio.sleep(delay)

    async def _worker(self) -> None:
        async for namespace, session_id in self.triggers.receive:
            self.triggers.queued.discard((namespace, session_id))
            try:
                await self.checkpoint(namespace, session_id)
            except NotFound:
                pass  # expired between the emit and the checkpoint: nothing left to anchor
            except Exception as exc:  # keep the worker alive; the next trigger retries the window
                log.warning("background checkpoint failed", session_id=session_id, error=repr(exc))

    async def checkpoint(self, namespace: str, session_id: str, final: bool = False) -> dict[str, Any]:
        """Checkpoint the window since the last checkpoint; the result of `session.checkpoint`."""
        self.in_flight += 1
        try:
            lock = self.backends.redis.lock(keys.checkpoint_lock(namespace, session_id), timeout=LOCK_TTL,
                                            blocking_timeout=LOCK_TTL)
            async with lock:
                return await self._checkpoint(namespace, session_id, final)
        finally:
            self.in_flight -= 1

    async def _checkpoint(self, namespace: str, session_id: str, final: bool) -> dict[str, Any]:
        started = time.perf_counter()
        session, _ = await self.manager.read(namespace, session_id, 0, 1)
        last = session["lastCheckpoint"] or {}
        if session["state"] == "completed" or (not final and last.get("seq") == session["seq"]):
            return {**last.get("result", {}), "checkpointId": last.get("id")}
        # The view and the window's first page in one read, then the rest a page at a time up to the view's
        # seq, so the window ends exactly there and no read holds more than a chunk of it.
        count = per_read(self.settings.suspend_chunk_bytes)
        session, first = await self.manager.read(namespace, session_id, int(last.get("seq", 0)), count)
        snapshots = session["state"] == "broken" and self.backends.postgres.enabled  # the outcome is the state
        if snapshots and len(first) == count:
            # A broken window's snapshot stores every event of it: read whole with the view, as one read, so a
            # compaction running meanwhile cannot take a page of it away.
            session, first = await self.manager.read(namespace, session_id, int(last.get("seq", 0)))
        pages = self._window(keys.session_keys(namespace, session_id), int(session["seq"]), first, count)
        events, summary = await self._summarise(namespace, pages, session["state"], keep=snapshots)
        CHECKPOINT_ENTITIES_SKIPPED.inc(summary.entities_skipped)
        cp_id = checkpoint_id(namespace, session["epoch"], session_id, session["seq"], final)
        result = {"checkpointId": cp_id, **_wire(summary)}
        snapshot = None
        if snapshots:
            snapshot = await self._new_snapshot(namespace, session, last, cp_id, events)
            await self.pending.write(snapshot)  # kept before Postgres is asked: it will exist whatever happens next
        with unwrap_group():
            async with anyio.create_task_group() as tg:  # the graph and Postgres writes are independent
                tg.start_soon(self._anchor, namespace, session_id, cp_id, summary, snapshot)
                if snapshot is not None:
                    result.update(await self._store(snapshot))
        upto = session["seq"] if snapshot is not None else snapshot_from(last)
        await self._mark(namespace, session_id, cp_id, session["seq"], result, final, upto)
        CHECKPOINTS.labels(summary.outcome).inc()
        log.info("checkpoint", session_id=session_id, checkpoint_id=cp_id, outcome=summary.outcome,
                 ms=round((time.perf_counter() - started) * 1000, 2))
        return result

    async def _window(self, skeys: keys.SessionKeys, upto: int, first: list[str],
                      count: int) -> AsyncIterator[list[str]]:
        """The window's raw events a page at a time: `first` (read with the view), then pages of `count` up to
        seq `upto`. A window can hold a session's every event (a tenant's checkpoints paced behind its batches,
        a large MEMENTO_CHECKPOINT_EVERY), 300 MB of them at the largest event size."""
        yield first
        if len(first) == count:
            async for page in redis_events(self.backends.redis, skeys, seq_of(first[-1]), upto, count):
                yield page

    async def _summarise(self, namespace: str, pages: AsyncIterator[list[str]], state: str,
                         keep: bool) -> tuple[list[dict[str, Any]], Summary]:
        """The window's events decoded and summarised a part at a time (at most DECODE_PART events, so at
        most 1,024 ids: well under a millisecond), with a turn for the daemon's other work between parts: a
        window of 100,000 new ids never holds the event loop for longer than one part takes, and the ids are let
        go of in parts too (limits.let_go). The decoded events are returned with `keep` (a broken window's
        snapshot stores them); otherwise the list is empty, and the daemon holds one page of the window at a
        time. The parts of one namespace go at most MEMENTO_BATCH_IDS_PACE ids a second (limits.py)."""
        tally, events = Tally(self.settings.checkpoint_max_entities), []
        async for members in pages:
            for start in range(0, len(members), DECODE_PART):
                part = [decode(member) for member in members[start:start + DECODE_PART]]
                if keep:
                    events += part
                await self.pacer.take(namespace, tally.add(part))
        summary = tally.summary(state)
        await let_go(tally.seen)
        return events, summary

    async def _new_snapshot(self, namespace: str, session: dict[str, Any], last: dict[str, Any], cp_id: str,
                            window: list[dict[str, Any]]) -> Pending:
        """The snapshot of a broken checkpoint: the events no earlier snapshot of this epoch holds."""
        seq, after = int(session["seq"]), snapshot_from(last)
        events = window
        if after != int(last.get("seq", 0)):  # the window starts later than the unsnapshotted events
            _, members = await self.manager.read(namespace, session["sessionId"], after)
            events = [decode(member) for member in members]
        events = [event for event in events if int(event["seq"]) <= seq]
        return Pending(namespace, session["sessionId"], cp_id, session["epoch"], after, seq, "broken", events,
                       datetime.now(UTC))

    async def _store(self, snapshot: Pending) -> dict[str, Any]:
        """Store the snapshot now if Postgres answers in time; otherwise it waits in Redis for the flusher."""
        try:
            with anyio.fail_after(2.0):
                snapshot_id = await snapshot.store(self.snapshots)
        except SNAPSHOT_TRANSIENT as exc:
            SNAPSHOTS_DEFERRED.inc()
            log.warning("failure snapshot deferred; kept in Redis until Postgres takes it",
                        checkpoint_id=snapshot.checkpoint_id, error=repr(exc))
            return {"snapshotPending": True}
        await self.pending.done(snapshot)
        return {"snapshotId": snapshot_id}

    async def _anchor(self, namespace: str, session_id: str, cp_id: str, summary: Summary,
                      snapshot: Pending | None) -> None:
        """Write the anchor. It names the snapshot row by its checkpoint id, known before the row exists (or while
        it is retried), so the pending snapshot is indexed first: once an anchor names it, any daemon's flusher
        finds it, whatever becomes of this one. Postgres is storing it meanwhile."""
        ref = None
        if snapshot is not None:
            await self.pending.index(snapshot)
            ref = snapshot_ref(cp_id)

        async def write() -> int:
            graph = await self.graphs.get(namespace)
            return await write_anchor(graph, cp_id, session_id, summary, datetime.now(UTC),
                                      self.settings.anchor_cap, ref, self.settings.anchor_chunk)

        KG_ANCHORS_WRITTEN.inc(await retry(write, (BackendUnavailable,), attempts=3, first=0.05, jitter=False))

    async def _mark(self, namespace: str, session_id: str, cp_id: str, seq: int, result: dict[str, Any],
                    final: bool, snapshot_seq: int) -> None:
        """Record the checkpoint on the session (completing it when final) and notify subscribers."""
        record = {"id": cp_id, "seq": seq, "outcome": result["outcome"], "at": now_ms(), "result": result,
                  "snapshotSeq": snapshot_seq}
        note = {"sessionId": session_id, "checkpointId": cp_id, "outcome": result["outcome"]}
        announce = {"type": "completed" if final else "checkpoint", **note}
        await self.manager.store.call(
            "ms_checkpoint", keys.session_keys(namespace, session_id), now_ms(),
            pydantic_core.to_json(record).decode(), "1" if final else "0", self.settings.checkpoint_grace_ttl,
            keys.session_channel(namespace, session_id), encode_notification("session.checkpoint", note).decode(),
            keys.announce_channel(namespace), encode_notification("sessions.announce", announce).decode(),
        )

    async def drain(self) -> None:
        """Wait (at most DRAIN_SECONDS) for queued and running checkpoints before shutdown."""
        with anyio.move_on_after(DRAIN_SECONDS):
            while self.triggers.queued or self.in_flight:  # noqa: ASYNC110 - workers signal nothing cheaper
                await anyio.sleep(0.02)


def _wire(summary: Summary) -> dict[str, Any]:
    """The result's summary fields; `entitiesSkipped` only when the window named more entities than it anchored."""
    wire = summary.to_wire()
    result = {key: wire[key] for key in ("outcome", "brokeDuring", "keyImpacts", "perfDelta", "actors", "entityIds")}
    if summary.entities_skipped:
        result["entitiesSkipped"] = summary.entities_skipped
    return result
