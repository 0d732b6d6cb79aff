"""Mailboxes: messages to an agent, a role or a session's agents; kept for the absent, pushed to the connected.

A send is first recorded once for the namespace (mc_post: its id claimed for its sender, its sender, subject and
body stored once, its recipients' mailboxes counted against MEMENTO_MAILBOXES_MAX, an agent never seen refused),
then referenced in each recipient's mailbox by one Function call on that agent's keys (idempotent by message id,
capped at MEMENTO_MAILBOX_MAX with the oldest dropped and counted) and published on the agent's channel, where
every daemon serving one of its connections pushes it, body included, at once. A reader gets each reference
with its body; a conflict alert (alerts.py) is one mailbox's alone and keeps its body in its copy. Each step of
a sent message's way to each recipient is recorded in its receipts (receipts.py); `surface` hands an agent's
context what it has not surfaced yet, once (the hook's answers, the MCP tools' notices).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.backends import UNAVAILABLE
from memento_sessions.coordination.receipts import Receipts
from memento_sessions.coordination.store import CoordStore
from memento_sessions.errors import Conflict, InvalidParams, NotFound
from memento_sessions.logs import get_logger
from memento_sessions.metrics import MAILBOX_DROPPED, MAILBOX_MESSAGES, MAILBOX_REFUSED
from memento_sessions.redisio.fanout import Fanout
from memento_sessions.rpc import Peer
from memento_sessions.sessions.manager import iso, now_ms
from memento_sessions.settings import Settings

log = get_logger(__name__)
Result = dict[str, Any]
MAX_RECIPIENTS = 1000  # agents one role or session send reaches at most
KNOWN_KEEP = 30 * 86400  # seconds an agent counts as seen after its last request (the longest message ttl)
KNOWN_REFRESH = 3600.0  # seconds between two writes of one agent's last-seen time by one daemon
KNOWN_RETRY = 5.0  # seconds before a write that Redis refused is tried again
MAX_REMEMBERED = 100_000  # agents one daemon remembers as written (cleared past it)
STORED, DUPLICATES = MAILBOX_MESSAGES.labels("stored"), MAILBOX_MESSAGES.labels("duplicate")
MAX_PUSH_RECEIPTS = 1000  # `pushed` receipts one daemon writes at once (past it, one is skipped)
Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]
LIMIT, TAKEN, UNKNOWN = (MAILBOX_REFUSED.labels(reason) for reason in ("mailbox_limit", "id_taken", "unknown_agent"))


@dataclass(frozen=True, slots=True)
class Encoded:
    """A message as mc_send stores it: its JSON after the `{` (the Function puts `"seq":N,` before it), what is
    pushed when that differs (a send's copy is a reference; its push carries the body), and the unix second it
    expires; encoded once however many mailboxes it goes to."""

    message_id: str
    tail: str
    until: int
    push: str | None = None

    @classmethod
    def of(cls, message: Result, ttl: int) -> Encoded:
        """Stamp `message` (with its messageId) sent now, expiring after `ttl` seconds: stored whole."""
        now = now_ms()
        full = {**message, "sentAt": iso(now), "expiresAt": iso(now + ttl * 1000)}
        return cls(message["messageId"], pydantic_core.to_json(full).decode()[1:], now // 1000 + ttl)

    @classmethod
    def reference(cls, message: Result, content: Result, ttl: int) -> Encoded:
        """`message`'s copy for each mailbox, without `content` (subject and body, stored once); pushed whole."""
        whole = cls.of({**message, **content}, ttl)
        stamps = pydantic_core.from_json("{" + whole.tail)
        ref = {key: value for key, value in stamps.items() if key not in content}
        return cls(whole.message_id, pydantic_core.to_json(ref).decode()[1:], whole.until, whole.tail)


class AgentFeed:
    """The fan-out listener of one agent's channel: every frame goes to each of its local connections."""

    def __init__(self, on_push: Callable[[str], None] | None = None) -> None:
        self.peers: dict[str, Peer] = {}
        self.on_push = on_push

    def on_message(self, data: str) -> None:
        """A mailbox message or lease conflict for the agent."""
        for peer in tuple(self.peers.values()):
            peer.notify(data)
        if self.peers and self.on_push is not None:
            self.on_push(data)

    def on_reconnect(self) -> None:
        """Nothing to catch up: what the push missed is in the mailbox."""


class Mailbox:
    """Send, read and ack over the agents' mailboxes, and the live push to connected agents."""

    def __init__(self, store: CoordStore, settings: Settings, fanout: Fanout | None) -> None:
        self.store = store
        self.settings = settings
        self.fanout = fanout
        self.feeds: dict[str, AgentFeed] = {}
        self.receipts = Receipts(store)
        self.spawn: Spawn | None = None  # set while the service runs: where `pushed` receipts are written
        self._pushing = 0
        self._known: dict[tuple[str, str], float] = {}  # agents written as seen: (namespace, agent) -> until when

    async def attach(self, namespace: str, agent: str, peer: Peer) -> None:
        """Push the agent's messages to this connection until it closes."""
        if self.fanout is None:
            return
        channel = keys.agent_channel(namespace, agent)
        feed = self.feeds.get(channel)
        if feed is None:
            feed = self.feeds[channel] = AgentFeed(lambda data: self._pushed(namespace, agent, data))
        feed.peers[peer.conn_id] = peer
        peer.on_close(lambda: self._detach(channel, feed, peer.conn_id))
        await self.fanout.attach(channel, feed)

    def _detach(self, channel: str, feed: AgentFeed, conn_id: str) -> None:
        feed.peers.pop(conn_id, None)
        if not feed.peers and self.fanout is not None:
            self.feeds.pop(channel, None)
            self.fanout.detach(channel, feed)

    def _pushed(self, namespace: str, agent: str, data: str) -> None:
        """A message reached a live connection of the agent: its `pushed` receipt, written in the background."""
        if self.spawn is None or self._pushing >= MAX_PUSH_RECEIPTS or '"method":"mailbox.message"' not in data[:80]:
            return
        message_id = pydantic_core.from_json(data).get("params", {}).get("messageId")
        if not isinstance(message_id, str):
            return

        async def write() -> None:
            self._pushing += 1
            try:
                await self.receipts.note(namespace, agent, "pushed", [message_id])
            except UNAVAILABLE as exc:
                log.warning("pushed receipt not written: Redis unavailable", agent_id=agent, error=repr(exc))
            finally:
                self._pushing -= 1
        self.spawn(write)

    async def recipients(self, who: Identity, to: str) -> list[str]:
        """The agents `to` names: an agent id, `role:<name>` or `session:<id>` (the sender left out of the last two)."""
        kind, _, name = to.partition(":")
        if kind == "role":  # a role some token grants reaches its tokens' agents; any other, those that declared it
            by_token = await self.store.command("SISMEMBER", keys.token_roles(who.namespace), name)
            members = await self.store.command("SMEMBERS", (keys.role_members if by_token else keys.declared_members)(
                who.namespace, name))
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
        """Record the message once, then put a reference to it in every recipient's mailbox and push it to those
        connected."""
        message_id = message_id or f"msg-{os.urandom(10).hex()}"
        agents = await self.recipients(who, to)
        if not agents:
            return {"messageId": message_id, "recipients": agents}
        message, content = {"messageId": message_id, "from": who.agent_id, "to": to}, {"subject": subject, "body": body}
        encoded = Encoded.reference(message, content, ttl or self.settings.mailbox_ttl)  # one JSON for all
        direct = to.partition(":")[0] not in ("role", "session")
        await self.post(who, encoded, {"from": who.agent_id, **content}, agents, direct)
        for agent in agents:
            await self.deliver(who.namespace, agent, encoded)
            await self.receipts.note(who.namespace, agent, "stored", [message_id], who.agent_id, encoded.until)
        return {"messageId": message_id, "recipients": agents}

    async def post(self, who: Identity, message: Encoded, content: Result, agents: list[str], direct: bool) -> None:
        """mc_post: the send's one record (see the module's docstring); a refusal raises its error, writing nothing."""
        boxes, known = keys.mail_keys(who.namespace)
        check = direct and not self.settings.mailbox_unknown_agents
        try:
            reply = await self.store.call(
                "mc_post", [keys.mail_body(who.namespace, message.message_id), boxes, known], who.agent_id,
                pydantic_core.to_json(content).decode(), message.until, self.settings.mailboxes_max,
                int(time.time()), int(check), *agents)
        except Conflict:
            LIMIT.inc()
            raise
        if reply == "TAKEN":
            TAKEN.inc()
            raise Conflict(f"message id {message.message_id!r} is used by another sender; nothing was sent",
                           {"reason": "id_taken", "messageId": message.message_id})
        if str(reply).startswith("UNKNOWN "):
            UNKNOWN.inc()
            raise InvalidParams("invalid params", [{"field": "to", "message": (
                f"no agent {str(reply)[8:]!r} has been seen in this namespace (MEMENTO_MAILBOX_UNKNOWN_AGENTS)")}])

    async def remember(self, who: Identity) -> None:
        """Note the agent as seen in its namespace (a send to it is no longer to an unknown agent): written once
        per process and agent, again after KNOWN_REFRESH; a Redis outage is logged and written next time."""
        agent, now = (who.namespace, who.agent_id), time.monotonic()
        if self._known.get(agent, 0.0) > now:
            return
        known = keys.mail_keys(who.namespace)[1]
        try:
            await self.store.command("ZADD", known, int(time.time()), who.agent_id)
            await self.store.command("EXPIRE", known, KNOWN_KEEP)
            await self.store.command("ZREMRANGEBYRANK", known, 0, -self.settings.agents_known_max - 1)
        except UNAVAILABLE as exc:  # tried again in a few seconds, not at every request of an outage
            log.warning("agent not noted as seen: Redis unavailable", agent_id=who.agent_id, error=repr(exc))
            self._note(agent, now + KNOWN_RETRY)
            return
        self._note(agent, now + KNOWN_REFRESH)

    def _note(self, agent: tuple[str, str], until: float) -> None:
        if len(self._known) >= MAX_REMEMBERED:
            self._known.clear()
        self._known[agent] = until

    async def deliver(self, namespace: str, agent: str, message: Encoded, method: str = "mailbox.message",
                      push: bool = True) -> bool:
        """Store one message for one agent and push it as `method` (one Function call does both: no message is
        pushed that is not stored; `push=False` stores it only); False when that id was stored already."""
        pushed = () if message.push is None else (message.push,)
        channel = keys.agent_channel(namespace, agent) if push else ""
        _, duplicate, dropped = await self.store.call(
            "mc_send", keys.mailbox_keys(namespace, agent), message.message_id, message.tail, self.settings.mailbox_max,
            message.until, channel, method, *pushed)
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
            found += await self._messages(who.namespace, messages, acked, ids, unread_only)
            cursor = int(await self.store.command("ZSCORE", order, ids[-1]))
            if len(ids) <= limit:
                break
        result: Result = {"messages": found[:limit]}
        if len(found) > limit:
            result["nextSince"] = found[limit - 1]["seq"]
        return result

    async def _messages(self, namespace: str, messages: str, acked: str, ids: Sequence[str],
                        unread_only: bool) -> list[Result]:
        raws = await self.store.command("HMGET", messages, *ids)
        read = await self.store.command("SMISMEMBER", acked, *ids)
        now, found = iso(now_ms()), []
        for raw, was_read in zip(raws, read, strict=True):
            message = pydantic_core.from_json(raw) if raw is not None else None
            if message is None or message["expiresAt"] <= now or (unread_only and was_read):
                continue
            found.append({**message, "read": bool(was_read)})
        return await self._with_bodies(namespace, found)

    async def _with_bodies(self, namespace: str, found: list[Result]) -> list[Result]:
        """Each reference joined to its body (one MGET: the bodies share the namespace's mail tag); a message
        whose body is gone (expired) is left out."""
        refs = [message["messageId"] for message in found if "body" not in message]
        if not refs:
            return found
        raws = await self.store.command("MGET", *(keys.mail_body(namespace, ref) for ref in refs))
        bodies = {ref: pydantic_core.from_json(raw) for ref, raw in zip(refs, raws, strict=True) if raw is not None}
        out = []
        for message in found:
            if "body" in message:
                out.append(message)
            elif message["messageId"] in bodies:
                content = bodies[message["messageId"]]
                out.append({**message, "subject": content["subject"], "body": content["body"]})
        return out

    async def ack(self, who: Identity, message_ids: Sequence[str]) -> Result:
        """Mark messages read; returns how many of them were in the mailbox."""
        acked = [str(message_id) for message_id in await self.store.call(
            "mc_ack", keys.mailbox_keys(who.namespace, who.agent_id), *message_ids)]
        await self.receipts.note(who.namespace, who.agent_id, "acked", acked)
        return {"acked": len(acked)}

    async def surface(self, who: Identity, limit: int) -> list[Result]:
        """The agent's unacked messages not surfaced to its context yet (at most `limit`, oldest first), each
        once however many hooks or tools ask at the same time; their `surfaced` receipts written."""
        mailbox = keys.mailbox_keys(who.namespace, who.agent_id)
        raws = await self.store.call("mc_surface", [*mailbox, keys.surfaced_key(who.namespace, who.agent_id)], limit)
        now = iso(now_ms())
        found = [message for message in map(pydantic_core.from_json, raws) if message["expiresAt"] > now]
        found = await self._with_bodies(who.namespace, found)
        await self.receipts.note(who.namespace, who.agent_id, "surfaced", [message["messageId"] for message in found])
        return found
