"""Mailboxes: messages to an agent, a role or a session's agents; kept for the absent, pushed to the connected.

A message is stored in each recipient's mailbox by one Function call on that agent's keys (idempotent
by message id, capped at MEMENTO_MAILBOX_MAX with the oldest dropped and counted) and then published
on the agent's channel, where every daemon serving one of its connections pushes it at once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.coordination.store import CoordStore
from memento_sessions.errors import NotFound
from memento_sessions.metrics import MAILBOX_DROPPED, MAILBOX_MESSAGES
from memento_sessions.redisio.fanout import Fanout
from memento_sessions.rpc import Peer
from memento_sessions.sessions.manager import iso, now_ms
from memento_sessions.settings import Settings

Result = dict[str, Any]
MAX_RECIPIENTS = 1000  # agents one role or session send reaches at most
STORED, DUPLICATES = MAILBOX_MESSAGES.labels("stored"), MAILBOX_MESSAGES.labels("duplicate")


@dataclass(frozen=True, slots=True)
class Encoded:
    """A message as mc_send stores it: its JSON after the `{` (the Function puts `"seq":N,` before it) and the
    unix second it expires; encoded once however many mailboxes it goes to."""

    message_id: str
    tail: str
    until: int

    @classmethod
    def of(cls, message: Result, ttl: int) -> Encoded:
        """Stamp `message` (with its messageId) sent now, expiring after `ttl` seconds."""
        now = now_ms()
        full = {**message, "sentAt": iso(now), "expiresAt": iso(now + ttl * 1000)}
        return cls(message["messageId"], pydantic_core.to_json(full).decode()[1:], now // 1000 + ttl)


class AgentFeed:
    """The fan-out listener of one agent's channel: every frame goes to each of its local connections."""

    def __init__(self) -> None:
        self.peers: dict[str, Peer] = {}

    def on_message(self, data: str) -> None:
        """A mailbox message or lease conflict for the agent."""
        for peer in tuple(self.peers.values()):
            peer.notify(data)

    def on_reconnect(self) -> None:
        """Nothing to catch up: what the push missed is in the mailbox."""


class Mailbox:
    """Send, read and ack over the agents' mailboxes, and the live push to connected agents."""

    def __init__(self, store: CoordStore, settings: Settings, fanout: Fanout | None) -> None:
        self.store = store
        self.settings = settings
        self.fanout = fanout
        self.feeds: dict[str, AgentFeed] = {}

    async def attach(self, namespace: str, agent: str, peer: Peer) -> None:
        """Push the agent's messages to this connection until it closes."""
        if self.fanout is None:
            return
        channel = keys.agent_channel(namespace, agent)
        feed = self.feeds.get(channel)
        if feed is None:
            feed = self.feeds[channel] = AgentFeed()
        feed.peers[peer.conn_id] = peer
        peer.on_close(lambda: self._detach(channel, feed, peer.conn_id))
        await self.fanout.attach(channel, feed)

    def _detach(self, channel: str, feed: AgentFeed, conn_id: str) -> None:
        feed.peers.pop(conn_id, None)
        if not feed.peers and self.fanout is not None:
            self.feeds.pop(channel, None)
            self.fanout.detach(channel, feed)

    async def recipients(self, who: Identity, to: str) -> list[str]:
        """The agents `to` names: an agent id, `role:<name>` or `session:<id>` (the sender left out of the last two)."""
        kind, _, name = to.partition(":")
        if kind == "role":
            members = await self.store.command("SMEMBERS", keys.role_members(who.namespace, name))
        elif kind == "session":
            skeys = keys.session_keys(who.namespace, name)
            if not await self.store.command("EXISTS", skeys.session):
                raise NotFound(f"session {name!r} not found", {"sessionId": name})
            members = await self.store.command("SMEMBERS", skeys.agents)
        else:
            return [to]
        return sorted(str(m) for m in members if str(m) != who.agent_id)[:MAX_RECIPIENTS]

    async def send(self, who: Identity, to: str, body: Any, subject: str | None = None, ttl: int | None = None,
                   message_id: str | None = None) -> Result:
        """Store the message in every recipient's mailbox and push it to those connected."""
        message_id = message_id or f"msg-{os.urandom(10).hex()}"
        agents = await self.recipients(who, to)
        message = {"messageId": message_id, "from": who.agent_id, "to": to, "subject": subject, "body": body}
        encoded = Encoded.of(message, ttl or self.settings.mailbox_ttl)  # the same JSON for every recipient
        for agent in agents:
            await self.deliver(who.namespace, agent, encoded)
        return {"messageId": message_id, "recipients": agents}

    async def deliver(self, namespace: str, agent: str, message: Encoded, method: str = "mailbox.message") -> bool:
        """Store one message for one agent and push it as `method` (one Function call does both: no message is
        pushed that is not stored); False when that id was stored already."""
        _, duplicate, dropped = await self.store.call(
            "mc_send", keys.mailbox_keys(namespace, agent), message.message_id, message.tail, self.settings.mailbox_max,
            message.until, keys.agent_channel(namespace, agent), method)
        (DUPLICATES if duplicate else STORED).inc()
        if dropped:
            MAILBOX_DROPPED.inc(int(dropped))
        return not duplicate

    async def read(self, who: Identity, since: int = 0, limit: int = 100, unread_only: bool = False) -> Result:
        """A page of the caller's messages with seq > since, oldest first; nextSince when more exist."""
        order, messages, acked = keys.mailbox_keys(who.namespace, who.agent_id)
        found: list[Result] = []
        cursor = since
        while len(found) <= limit:
            ids = await self.store.command("ZRANGEBYSCORE", order, f"({cursor}", "+inf", "LIMIT", 0, limit + 1)
            if not ids:
                break
            found += await self._messages(messages, acked, ids, unread_only)
            cursor = int(await self.store.command("ZSCORE", order, ids[-1]))
            if len(ids) <= limit:
                break
        result: Result = {"messages": found[:limit]}
        if len(found) > limit:
            result["nextSince"] = found[limit - 1]["seq"]
        return result

    async def _messages(self, messages: str, acked: str, ids: Sequence[str], unread_only: bool) -> list[Result]:
        raws = await self.store.command("HMGET", messages, *ids)
        read = await self.store.command("SMISMEMBER", acked, *ids)
        now, out = iso(now_ms()), []
        for raw, was_read in zip(raws, read, strict=True):
            if raw is None:
                continue
            message = pydantic_core.from_json(raw)
            if message["expiresAt"] <= now or (unread_only and was_read):
                continue
            out.append({**message, "read": bool(was_read)})
        return out

    async def ack(self, who: Identity, message_ids: Sequence[str]) -> Result:
        """Mark messages read; returns how many of them were in the mailbox."""
        count = await self.store.call("mc_ack", keys.mailbox_keys(who.namespace, who.agent_id), *message_ids)
        return {"acked": int(count)}
