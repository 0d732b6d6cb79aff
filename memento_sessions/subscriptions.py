"""`session.subscribe`, `session.unsubscribe` and `sessions.watch`: replay, then live, gap-free.

A subscription is attached to the channel before the history is read, and buffers live frames
while it replays; after the replay it delivers the buffered frames whose seq is newer. Every
frame carries its seq, so a gap (after a pub/sub reconnect) is filled from the ZSET and a
duplicate is dropped: each seq reaches the client exactly once, in order.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from pydantic import Field

from memento_sessions import keys
from memento_sessions.errors import InvalidParams
from memento_sessions.fanout import Fanout, event_frame, frame_head, frame_seq
from memento_sessions.logs import get_logger
from memento_sessions.rpc import Call, Peer, Registry, Result
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.methods import Params, SessionParams

log = get_logger(__name__)
REPLAY_CHUNK = 500


class Subscription:
    """One client's subscription to one session."""

    def __init__(self, peer: Peer, manager: SessionManager, fanout: Fanout, namespace: str, session_id: str) -> None:
        self.peer, self.manager, self.fanout = peer, manager, fanout
        self.namespace, self.session_id = namespace, session_id
        self.channel = keys.session_channel(namespace, session_id)
        self.session_json = pydantic_core.to_json(session_id).decode()
        self.last_seq = 0
        self.epoch = ""
        self.live = False
        self.pending: list[str] = []
        self.closed = False

    def on_message(self, data: str) -> None:
        """A live frame: buffered while catching up, else delivered if it is the next seq."""
        if not self.live:
            self.pending.append(data)
            return
        head = frame_head(data)
        if head is None:
            self.peer.notify(data)
            return
        seq, epoch = head
        if epoch != self.epoch:
            # The session was created anew under this id: its history restarts at seq 1.
            self.epoch, self.last_seq = epoch, 0
        if seq == self.last_seq + 1:
            self.last_seq = seq
            self.peer.notify(data)
        elif seq > self.last_seq + 1:
            self.pending.append(data)
            self.on_reconnect()

    def on_reconnect(self) -> None:
        """Frames may have been missed: replay from the ZSET, then go live again."""
        if self.live:
            self.live = False
            self.fanout.spawn(self.catch_up)

    async def catch_up(self) -> None:
        """Replay everything after last_seq from the ZSET, then the buffered frames, then go live."""
        try:
            await self._replay()
        except Exception as exc:  # a backend error: the next reconnect or gap retries
            log.warning("catch-up failed", session_id=self.session_id, error=repr(exc))
            self.live = True
            return
        self._flush_pending()

    async def _replay(self) -> None:
        while not self.closed:
            _, members = await self.manager.read(self.namespace, self.session_id, self.last_seq, REPLAY_CHUNK)
            for member in members:
                seq = member_seq(member)
                frame = event_frame(self.session_json, self.epoch, member, seq)
                await self.peer.wait_room(len(frame))
                self.peer.notify(frame)
                self.last_seq = seq
            if len(members) < REPLAY_CHUNK:
                return

    def _flush_pending(self) -> None:
        pending, self.pending = self.pending, []
        self.live = True
        for frame in pending:
            seq = frame_seq(frame)
            if seq is None or seq > self.last_seq:
                self.on_message(frame)


class Watch:
    """A `sessions.watch`: every announcement of the namespace, as it comes."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    def on_message(self, data: str) -> None:
        self.peer.notify(data)

    def on_reconnect(self) -> None:
        """Announcements are not stored: a missed one is gone (clients list sessions to resync)."""


class SubscribeParams(SessionParams):
    since: int | None = Field(default=None, ge=0)
    epoch: str | None = Field(default=None, max_length=64)


class Subscriptions:
    """Every subscription and watch of this daemon, by connection."""

    def __init__(self, manager: SessionManager, fanout: Fanout) -> None:
        self.manager, self.fanout = manager, fanout
        self.active: dict[tuple[str, str, str], Subscription] = {}
        self.watches: dict[tuple[str, str], Watch] = {}

    async def subscribe(self, call: Call, p: SubscribeParams) -> Result:
        """Attach, read the session, replay what `since` asks for, then deliver live."""
        peer = require_peer(call)
        key = (peer.conn_id, call.identity.namespace, p.sessionId)
        self.unsubscribe_key(key)
        sub = Subscription(peer, self.manager, self.fanout, call.identity.namespace, p.sessionId)
        self.active[key] = sub
        peer.on_close(lambda: self.unsubscribe_key(key))
        try:
            await self.fanout.attach(sub.channel, sub)
            session, _ = await self.manager.read(sub.namespace, sub.session_id, 0, 1)
        except BaseException:
            self.unsubscribe_key(key)
            raise
        return await self._start(sub, session, p)

    async def _start(self, sub: Subscription, session: dict[str, Any], p: SubscribeParams) -> Result:
        seq, epoch = session["seq"], session["epoch"]
        sub.epoch = epoch
        recovered = p.since is not None and p.since <= seq and (p.epoch is None or p.epoch == epoch)
        sub.last_seq = p.since if recovered and p.since is not None else seq
        # No await between here and the reply: the reply is queued before the first replayed event.
        sub.fanout.spawn(sub.catch_up)
        return {"seq": seq, "epoch": epoch, "recovered": recovered}

    def unsubscribe_key(self, key: tuple[str, str, str]) -> None:
        sub = self.active.pop(key, None)
        if sub is not None:
            sub.closed = True
            self.fanout.detach(sub.channel, sub)

    async def unsubscribe(self, call: Call, p: SessionParams) -> Result:
        self.unsubscribe_key((require_peer(call).conn_id, call.identity.namespace, p.sessionId))
        return {}

    async def watch(self, call: Call, _: Params) -> Result:
        """Forward the namespace's announcements to this connection."""
        peer = require_peer(call)
        key = (peer.conn_id, call.identity.namespace)
        if key not in self.watches:
            watch = self.watches[key] = Watch(peer)
            channel = keys.announce_channel(call.identity.namespace)
            peer.on_close(lambda: self._unwatch(key, channel))
            await self.fanout.attach(channel, watch)
        return {}

    def _unwatch(self, key: tuple[str, str], channel: str) -> None:
        watch = self.watches.pop(key, None)
        if watch is not None:
            self.fanout.detach(channel, watch)

    def register(self, registry: Registry) -> None:
        registry.add("session.subscribe", SubscribeParams, self.subscribe, "sessions:read")
        registry.add("session.unsubscribe", SessionParams, self.unsubscribe, "sessions:read")
        registry.add("sessions.watch", Params, self.watch, "sessions:read")


def member_seq(member: str) -> int:
    """The seq of a stored event, which always starts `{"seq":N,`."""
    return int(member[7:member.index(",", 7)])


def require_peer(call: Call) -> Peer:
    """Subscriptions need a connection to deliver to."""
    if call.peer is None:
        raise InvalidParams("subscriptions need a WebSocket connection", [{"field": "method",
                                                                          "message": "WebSocket only"}])
    return call.peer
