"""`session.subscribe`, `session.unsubscribe` and `sessions.watch`: replay, then live, gap-free.

A subscription is attached to the channel before the history is read, and buffers live frames
while it replays; after the replay it delivers the buffered frames whose seq is newer. Every
frame carries its seq, so a gap (after a pub/sub reconnect) is filled from the ZSET and a
duplicate is dropped: each seq reaches the client exactly once, in order.

A catch-up that finds the stored history is not the one delivered (a failover lost events this subscription
had already delivered, so the session's seq is behind its last one; or the session has another epoch) tells
the client with a `session.recovery` notification (`recovered: false`, the epoch and the seq delivery goes on
after) and delivers the stored history anew. A seq found behind moves the session to a new epoch first
(`ms_rewind`), so the seqs the lost events had are never handed out again within the epoch they were heard in.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import anyio
import pydantic_core

from memento_sessions import keys
from memento_sessions.backends import UNANSWERED
from memento_sessions.errors import Conflict, InvalidParams, NotFound, Reason
from memento_sessions.logs import get_logger
from memento_sessions.metrics import WS_REFUSED
from memento_sessions.redisio.fanout import Fanout
from memento_sessions.retry import Failures
from memento_sessions.rpc import Call, Result
from memento_sessions.sessions.frames import event_frame, frame_head, frame_seq, member_seq
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.methods import Params, SessionParams, SubscribeParams
from memento_sessions.sessions.snapshots import snapshot_at

log = get_logger(__name__)
REPLAY_CHUNK = 500


@runtime_checkable
class Feed(Protocol):
    """What a subscription needs of its connection: rpc.Peer, plus counting held-back frames against its buffer."""

    conn_id: str

    def notify(self, frame: str) -> None:
        """Queue one frame for the client."""

    async def wait_room(self, nbytes: int) -> None:
        """Wait until `nbytes` more fit in the send buffer."""

    def on_close(self, cleanup: Callable[[], None]) -> None:
        """Run `cleanup` when the connection ends."""

    def after_reply(self, start: Callable[[], None]) -> None:
        """Run `start` once the reply to the current request is queued."""

    def hold(self, nbytes: int) -> bool:
        """Count held-back bytes against the send buffer; False when the client was closed for it."""

    def release(self, nbytes: int) -> None:
        """Give back held bytes."""


class Subscription:
    """One client's subscription to one session."""

    # Read per delivery, as Connection's: see there.
    __slots__ = ("_replay", "channel", "closed", "epoch", "fanout", "last_seq", "left_epoch", "live", "manager",
                 "namespace", "peer", "pending", "pending_bytes", "session_id", "session_json")

    def __init__(self, peer: Feed, manager: SessionManager, fanout: Fanout, namespace: str, session_id: str) -> None:
        self.peer, self.manager, self.fanout = peer, manager, fanout
        self.namespace, self.session_id = namespace, session_id
        self.channel = keys.session_channel(namespace, session_id)
        self.session_json = pydantic_core.to_json(session_id).decode()
        self.last_seq = 0
        self.epoch = ""
        self.left_epoch = ""  # the epoch a recovery moved away from: its frames still in flight are not news
        self.live = False
        self.pending: list[str] = []
        self.pending_bytes = 0
        self.closed = False
        self._replay: anyio.CancelScope | None = None

    def on_message(self, data: str) -> None:
        """A live frame: held while catching up, else delivered if it is the next seq."""
        if self.closed:
            return
        if not self.live:
            self._hold(data)
            return
        head = frame_head(data)
        if head is None:
            self.peer.notify(data)
            return
        seq, epoch = head
        if epoch == self.left_epoch:
            return  # stored before the recovery, so in the history it replays under the new epoch
        if epoch != self.epoch:
            # The session was created anew under this id: its history restarts at seq 1.
            self.epoch, self.last_seq = epoch, 0
        if seq == self.last_seq + 1:
            self.last_seq = seq
            self.peer.notify(data)
        elif seq > self.last_seq + 1:
            self._hold(data)
            self.on_reconnect()

    def _hold(self, data: str) -> None:
        """Keep a live frame for after the replay, counted against the connection's send buffer."""
        if self.peer.hold(len(data)):
            self.pending.append(data)
            self.pending_bytes += len(data)
        # else the client is being closed as a slow consumer, and the frame goes with it

    def on_reconnect(self) -> None:
        """Frames may have been missed: replay from the ZSET, then go live again."""
        if self.live and not self.closed:
            self.live = False
            self.fanout.spawn(self.catch_up)

    def close(self) -> None:
        """Stop at once: an in-flight replay is cancelled and nothing of this subscription is sent after."""
        self.closed = True
        if self._replay is not None:
            self._replay.cancel()
        self._take_pending()

    async def catch_up(self) -> None:
        """Replay everything after last_seq from the ZSET, then the held frames, then go live.

        Anything but the session being gone (a failover still under way: CLUSTERDOWN, a lost connection, two
        primaries sending the slot to each other) is retried after the reconnect policy's pauses, holding live
        frames meanwhile: live without the replay, the subscription would never see that the history went
        back, and take the events given its lost seqs for duplicates."""
        if self.closed:
            return
        failures = Failures(self.fanout.backoff)
        with anyio.CancelScope() as self._replay:
            while True:
                try:
                    await self._replay_events()
                    break
                except NotFound:  # expired or deleted: nothing to replay; a session made anew restarts at seq 1
                    break
                except Exception as exc:
                    pause = failures.failed()
                    if failures.count == 1:  # one line per outage and subscription, not one per try
                        log.warning("catch-up failed; retrying", session_id=self.session_id, error=repr(exc),
                                    unanswered=isinstance(exc, UNANSWERED), retry_in=round(pause, 3))
                    await anyio.sleep(pause)
            self._flush_pending()
        self._replay = None

    async def _replay_events(self) -> None:
        while not self.closed:
            session, members = await self.manager.read(self.namespace, self.session_id, self.last_seq, REPLAY_CHUNK)
            if session["epoch"] != self.epoch or session["seq"] < self.last_seq:
                await self._recover(session)
                continue
            for member in members:
                seq = member_seq(member)
                frame = event_frame(self.session_json, self.epoch, member, seq)
                await self.peer.wait_room(len(frame))
                self.peer.notify(frame)
                self.last_seq = seq
            self._trim_pending()
            if len(members) < REPLAY_CHUNK:
                return

    async def _recover(self, session: dict[str, Any]) -> None:
        """The stored history is not the one delivered: tell the client (`recovered: false`) and start it over
        from the session's first stored event, under the session's epoch (a new one when the seq went back)."""
        epoch = session["epoch"]
        if epoch == self.epoch:
            # A failover lost events already delivered, and the session hands their seqs out again: move it to
            # a new epoch (once, however many subscriptions find it), so no seq means two events in one epoch.
            skeys = keys.session_keys(self.namespace, self.session_id)
            moved = await self.manager.store.call("ms_rewind", skeys, self.epoch, uuid.uuid4().hex[:16])
            epoch = moved.decode() if isinstance(moved, bytes) else str(moved)
            log.warning("session history went back; delivering it anew", session_id=self.session_id,
                        delivered_seq=self.last_seq, stored_seq=session["seq"], epoch=epoch)
        self._take_pending()  # frames of the left epoch; the replay delivers what of them is stored
        self.left_epoch, self.epoch = self.epoch, epoch
        self.last_seq = int(session.get("compactedSeq") or 0)
        frame = recovery_frame(self.session_json, epoch, self.last_seq)
        await self.peer.wait_room(len(frame))
        self.peer.notify(frame)

    def _trim_pending(self) -> None:
        """Drop held frames the replay has just delivered from the ZSET: a fast reader holds only newer ones."""
        kept = [frame for frame in self.pending if (seq := frame_seq(frame)) is None or seq > self.last_seq]
        if len(kept) < len(self.pending):
            self._take_pending()
            for frame in kept:
                self._hold(frame)

    def _take_pending(self) -> list[str]:
        pending, self.pending = self.pending, []
        self.peer.release(self.pending_bytes)
        self.pending_bytes = 0
        return pending

    def _flush_pending(self) -> None:
        pending = self._take_pending()
        self.live = True
        for frame in pending:
            seq = frame_seq(frame)
            if seq is None or seq > self.last_seq:
                self.on_message(frame)


class Watch:
    """A `sessions.watch`: every announcement of the namespace, as it comes."""

    def __init__(self, peer: Feed, channel: str) -> None:
        self.peer, self.channel = peer, channel
        self.closed = False

    def on_message(self, data: str) -> None:
        if not self.closed:
            self.peer.notify(data)

    def on_reconnect(self) -> None:
        """Announcements are not stored: a missed one is gone (clients list sessions to resync)."""

    def close(self) -> None:
        self.closed = True


Key = tuple[str, ...]
Entries = dict[Key, Subscription | Watch]


class Subscriptions:
    """Every subscription and watch of this daemon, by connection, at most `limit` per connection."""

    def __init__(self, manager: SessionManager, fanout: Fanout, limit: int | None = None) -> None:
        self.manager, self.fanout = manager, fanout
        self.limit = limit or manager.settings.ws_max_subscriptions
        self.conns: dict[str, Entries] = {}

    def _entries(self, peer: Feed) -> Entries:
        """This connection's subscriptions; the first one registers the connection's single cleanup."""
        entries = self.conns.get(peer.conn_id)
        if entries is None:
            entries = self.conns[peer.conn_id] = {}
            conn_id = peer.conn_id
            peer.on_close(lambda: self._drop_connection(conn_id))
        return entries

    def _admit(self, entries: Entries, key: Key) -> None:
        if key not in entries and len(entries) >= self.limit:
            WS_REFUSED.labels("too_many_subscriptions").inc()
            raise Conflict(f"too many subscriptions on this connection (at most {self.limit})",
                           {"reason": Reason.TOO_MANY_SUBSCRIPTIONS, "limit": self.limit})

    def _remove(self, entries: Entries, key: Key) -> None:
        entry = entries.pop(key, None)
        if entry is not None:
            entry.close()
            self.fanout.detach(entry.channel, entry)

    def _drop_connection(self, conn_id: str) -> None:
        entries = self.conns.pop(conn_id, {})
        for key in list(entries):
            self._remove(entries, key)

    async def subscribe(self, call: Call, p: SubscribeParams) -> Result:
        """Attach, read the session, replay what `since` asks for, then deliver live."""
        peer = require_peer(call)
        entries = self._entries(peer)
        key = ("session", call.identity.namespace, p.sessionId)
        self._admit(entries, key)
        self._remove(entries, key)  # a re-subscribe replaces the old one, whose replay stops here
        sub = entries[key] = Subscription(peer, self.manager, self.fanout, call.identity.namespace, p.sessionId)
        try:
            await self.fanout.attach(sub.channel, sub)
            session, _ = await self.manager.read(sub.namespace, sub.session_id, 0, 1)
            snapshot = await self._snapshot_below(sub, session, p)
        except BaseException:
            if entries.get(key) is sub:
                self._remove(entries, key)
            raise
        return await self._start(sub, session, p, snapshot)

    async def _snapshot_below(self, sub: Subscription, session: dict[str, Any],
                              p: SubscribeParams) -> dict[str, Any] | None:
        """The compaction snapshot standing for the events a `since` below the compacted seq asks for."""
        compacted = int(session.get("compactedSeq", 0))
        if p.since is None or p.since >= compacted:
            return None
        snap = await snapshot_at(self.manager.store, keys.session_keys(sub.namespace, sub.session_id), compacted)
        return snap.wire() if snap is not None else {"seq": compacted}

    async def _start(self, sub: Subscription, session: dict[str, Any], p: SubscribeParams,
                     snapshot: dict[str, Any] | None = None) -> Result:
        seq, epoch = session["seq"], session["epoch"]
        sub.epoch = epoch
        recovered = p.since is not None and p.since <= seq and (p.epoch is None or p.epoch == epoch)
        sub.last_seq = p.since if recovered and p.since is not None else seq
        if snapshot is not None and recovered:
            # The events up to the compacted seq are gone: answer with the snapshot that stands for them and
            # replay what is stored after it, never a history with a silent hole.
            recovered, sub.last_seq = False, int(snapshot["seq"])
        # The replay starts once the reply is queued, so the client has it before the first replayed event.
        sub.peer.after_reply(lambda: sub.fanout.spawn(sub.catch_up))
        reply: Result = {"seq": seq, "epoch": epoch, "recovered": recovered}
        if snapshot is not None and not recovered and sub.last_seq == snapshot["seq"]:
            reply["snapshot"] = snapshot
        return reply

    async def unsubscribe(self, call: Call, p: SessionParams) -> Result:
        """Stop the subscription at once, its replay included."""
        entries = self.conns.get(require_peer(call).conn_id)
        if entries is not None:
            self._remove(entries, ("session", call.identity.namespace, p.sessionId))
        return {}

    async def watch(self, call: Call, _: Params) -> Result:
        """Forward the namespace's announcements to this connection."""
        peer = require_peer(call)
        entries = self._entries(peer)
        key = ("watch", call.identity.namespace)
        if key not in entries:
            self._admit(entries, key)
            watch = entries[key] = Watch(peer, keys.announce_channel(call.identity.namespace))
            try:
                await self.fanout.attach(watch.channel, watch)
            except BaseException:
                self._remove(entries, key)
                raise
        return {}


def recovery_frame(session_json: str, epoch: str, seq: int) -> str:
    """`session.recovery`: the history delivered so far is gone; delivery goes on after `seq` in `epoch`."""
    params = '{"sessionId":' + session_json + ',"seq":' + str(seq) + ',"epoch":' + pydantic_core.to_json(epoch).decode()
    return '{"jsonrpc":"2.0","method":"session.recovery","params":' + params + ',"recovered":false}}'


def require_peer(call: Call) -> Feed:
    """Subscriptions need a WebSocket connection to deliver to."""
    if not isinstance(call.peer, Feed):
        raise InvalidParams("subscriptions need a WebSocket connection", [{"field": "method",
                                                                          "message": "WebSocket only"}])
    return call.peer
